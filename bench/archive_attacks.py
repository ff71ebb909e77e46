"""#34's attacks on the evidence archive, each against the real ``runner check-archive`` (or
``runner archive``, where the attack is at archive time) in a process of its own: the line it
printed last (its verdict), its exit code, and what it cost at its peak: memory (the largest
resident set of the process and what it waited for, from GNU time), disk (the most its scratch
directory held, polled), CPU and wall seconds.

The genuine run is the demo lock's cells (``--lock``: another lock's, e.g. the seed run's 36) on
the fast tests' fake guest (tests/support/fake_lab.py), archived twice (the same bytes) and
checked; every hostile input is built from it with the tests' own builders
(tests/support/hostile_archives.py, scan_evasions.py), at the issue's scale: the 2 GiB and 4 GiB
cases are a few MiB of gzip, written streamed. ``--archive FILE --key FILE`` adds a real run's
archive, checked alike. Nothing here is a pass/fail test; all of it is loopback-free (no network
at all) and takes some minutes on two busy cores.

    python -m bench.archive_attacks [--json FILE] [--archive FILE --key FILE] [--lock LOCK]
        [--genuine-only]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.table import Table

from runner.archive.tarball import write_archive
from runner.core.roots import CACHE_ENV, REPO_ROOT, cache_root
from runner.records.paths import RunPaths
from runner.run.execute import ExecuteOptions, execute
from tests.support import hostile_archives as hostile
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import FakeTransport, trial_tree
from tests.support.scan_evasions import EVASIONS

DEMO = REPO_ROOT / "locks" / "demo.toml"
RUNNER = [sys.executable, "-c", "from runner.cli.main import main; main()"]
MIB = 1 << 20


@dataclass(frozen=True)
class Measured:
    case: str
    command: str
    exit: int
    verdict: str
    input_mib: float
    peak_rss_mib: float
    peak_disk_mib: float
    cpu_s: float
    wall_s: float


def disk_used(directory: Path) -> int:
    used = 0
    for top, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while walked
                used += os.lstat(os.path.join(top, name)).st_blocks * 512
    return used


@contextlib.contextmanager
def peak_disk(directory: Path) -> Iterator[list[int]]:
    """The sizes ``directory`` held, polled every 20 ms while the block runs."""
    stop, seen = threading.Event(), [0]

    def poll() -> None:
        while not stop.is_set():
            seen.append(disk_used(directory))
            time.sleep(0.02)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


class Bench:
    """Runs each case's command in its own process and keeps what it measured."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: list[Measured] = []

    def run(self, case: str, args: list[str], subject: Path, scratch: Path) -> Measured:
        """``runner ARGS`` with TMPDIR=``scratch`` (watched, as is the archive's own directory
        for `runner archive`); ``subject`` is the input whose size is reported."""
        scratch.mkdir(parents=True, exist_ok=True)
        out, err, used = (self.root / name for name in ("stdout", "stderr", "time"))
        # GNU time forks the check from its own small process: a child forked from this one
        # would carry this process's resident set into its peak (Linux keeps it across exec).
        timed = ["/usr/bin/time", "-o", str(used), "-f", "%M %U %S", *RUNNER, *args]
        env = {**os.environ, "TMPDIR": str(scratch)}
        with out.open("wb") as stdout, err.open("wb") as stderr, peak_disk(scratch) as seen:
            started = time.monotonic()
            child = subprocess.run(timed, cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr)
            wall = time.monotonic() - started
        rss_kib, user, system = last_line(used.read_text()).split()
        printed = [self.short(path.read_text(errors="replace")) for path in (err, out)]
        measured = Measured(
            case=case,
            command=args[0],
            exit=child.returncode,
            verdict=last_line(printed[0]) or last_line(printed[1]),
            input_mib=size_of(subject) / MIB,
            peak_rss_mib=int(rss_kib) / 1024,
            peak_disk_mib=max(seen) / MIB,
            cpu_s=float(user) + float(system),
            wall_s=wall,
        )
        self.rows.append(measured)
        return measured

    def check(self, case: str, archive: Path, key: Path, *flags: str) -> Measured:
        scratch = self.root / "scratch" / case
        return self.run(
            case, ["check-archive", str(archive), "--key", str(key), *flags], archive, scratch
        )

    def archive(self, case: str, run_dir: Path, *flags: str) -> tuple[Measured, Path]:
        out = self.root / "scratch" / case / "out" / "run.tar.gz"
        out.parent.mkdir(parents=True)
        return self.run(
            case, ["archive", str(run_dir), "--out", str(out), *flags], run_dir, out.parent
        ), out

    def short(self, text: str) -> str:
        return text.replace(str(self.root), "$T")


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def genuine_run(root: Path, lock: Path) -> Path:
    """A finished run of ``lock`` on the fake guest (its operator key in a cache of its own; a
    git task source's trees read from the host cache, where ``runner resolve`` put them)."""
    tasks = cache_root() / "tasks"
    os.environ[CACHE_ENV] = str(root / "cache")
    (root / "cache").mkdir()
    (root / "cache" / "tasks").symlink_to(tasks)
    lab = FakeLab(FakeTransport(trials=trial_tree(root / "t", "fail")))
    receipt = execute(ExecuteOptions(lock, root / "run", "fake"), Console(file=io.StringIO()), lab)
    assert receipt.status == "completed", receipt.reasons
    return root / "run"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def genuine(bench: Bench, run_dir: Path, key: Path) -> Path:
    """Two archives of the run, compared, and the first checked: the archive the outsider's
    attacks start from."""
    _, one = bench.archive("genuine: runner archive", run_dir)
    second, other = bench.archive("genuine: runner archive again", run_dir)
    same = "byte-identical" if sha256(one) == sha256(other) else "DIFFERENT BYTES"
    bench.rows[-1] = Measured(**{**asdict(second), "verdict": f"{same}, sha256 {sha256(one)[:16]}"})
    bench.check("genuine archive", one, key)
    return one


def outsider(bench: Bench, archive: Path, key: Path) -> None:
    """The tarball edited without the key."""
    built = bench.root / "built"
    built.mkdir()
    ledger = "run/cells.jsonl"
    cases: dict[str, Callable[[Path], object]] = {
        "forged members behind a junk devmajor header": partial(hostile.junk_devmajor, archive),
        "forged members behind a bad-checksum block": partial(hostile.bad_checksum_block, archive),
        "manifest lists 2 GiB of zeros, signature wrong": partial(
            hostile.manifest_listing_zeros, archive, size=2 << 30
        ),
        "last member declares 2 GiB (sparse), no data": partial(
            hostile.declaring_huge_size, archive, size=2 << 30
        ),
        "2 GiB of zeros, a member not listed, last": partial(
            hostile.with_extra_member, archive, name="run/big.bin", data=2 << 30, first=False
        ),
        "150 MiB forged ledger placed first": partial(
            hostile.with_extra_member, archive, name=ledger, data=150 << 20, first=True
        ),
        "256 MiB pax header after the members": partial(
            hostile.huge_pax_after, archive, size=256 << 20
        ),
        "256 MiB pax header first": partial(hostile.huge_pax_first, size=256 << 20),
        "junk GNU.sparse.map pax value": partial(hostile.sparse_map, archive),
    }
    for number, (case, build) in enumerate(cases.items()):
        out = built / f"{number}.tar.gz"
        build(out)
        bench.check(case, out, key)
        out.unlink()


def key_holder(bench: Bench, run_dir: Path, key: Path) -> None:
    """The run directory edited and signed again with the operator's key."""
    work = bench.root / "key-holder"
    bombs = hostile.copy_of(run_dir, work / "bombs")
    nested = hostile.nested_gzip(4 << 30)
    for name in ("a.gz", "b.gz"):
        (hostile.first_trial(RunPaths(bombs)) / name).write_bytes(nested)
    unscanned = hostile.signed_unscanned(bombs, work / "bombs.tar.gz")
    bench.check(f"two gzip-in-gzip members, {len(nested)} B each, 4 GiB inside", unscanned, key)

    hidden = work / "hidden.tar.gz"
    with hostile.trial_results_digest_only():
        write_archive(run_dir, hidden)
    bench.check("trial result.json digest-only under the limit", hidden, key)

    _, zero_limit = bench.archive("--size-limit 0: runner archive", run_dir, "--size-limit", "0")
    bench.check("--size-limit 0: check-archive", zero_limit, key)

    swapped = hostile.copy_of(run_dir, work / "swapped")
    hostile.rechained(RunPaths(swapped), hostile.two_lines_swapped)
    write_archive(swapped, work / "swapped.tar.gz")
    bench.check("ledger lines 2 and 3 swapped, re-chained", work / "swapped.tar.gz", key)


def scan_evasions(bench: Bench, run_dir: Path, key: Path) -> None:
    """Each evasive file in a trial's directory, archived by `runner archive` (refused if the
    scan finds it); then all of them in one archive signed without the scan, checked."""
    work = bench.root / "evasions"
    every = hostile.copy_of(run_dir, work / "every")
    for number, (case, build) in enumerate(EVASIONS.items()):
        tools = work / f"tools-{number}"
        tools.mkdir(parents=True)
        data = build(tools)
        one = hostile.copy_of(run_dir, work / f"run-{number}")
        (hostile.first_trial(RunPaths(one)) / "evasive").write_bytes(data)
        (hostile.first_trial(RunPaths(every)) / f"evasive-{number}").write_bytes(data)
        bench.archive(f"scan evasion: {case}", one)
        shutil.rmtree(one)
    unscanned = hostile.signed_unscanned(every, work / "every.tar.gz")
    bench.check(f"all {len(EVASIONS)} evasions, signed without the scan", unscanned, key)


def table(rows: list[Measured], seconds: float) -> Table:
    shown = Table(
        title=f"#34's attacks on the archive ({seconds:.0f} s in all)", title_justify="left"
    )
    for column in (
        "case",
        "runs",
        "exit",
        "input MiB",
        "peak RSS MiB",
        "peak disk MiB",
        "CPU s",
        "wall s",
    ):
        shown.add_column(column, justify="right" if "MiB" in column or " s" in column else "left")
    shown.add_column("the line it printed last", overflow="ellipsis", no_wrap=True, max_width=110)
    for row in rows:
        shown.add_row(
            row.case,
            row.command,
            str(row.exit),
            f"{row.input_mib:.2f}",
            f"{row.peak_rss_mib:.0f}",
            f"{row.peak_disk_mib:.1f}",
            f"{row.cpu_s:.1f}",
            f"{row.wall_s:.1f}",
            row.verdict,
        )
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row, its verdict whole, here")
    parser.add_argument("--archive", type=Path, help="a real run's archive, checked too")
    parser.add_argument("--key", type=Path, help="the operator's public key for --archive")
    parser.add_argument(
        "--lock",
        type=Path,
        default=DEMO,
        help="the genuine run's lock (locks/seed-arm64.toml: 36 cells)",
    )
    parser.add_argument(
        "--genuine-only", action="store_true", help="the genuine run's rows only, no attack"
    )
    args = parser.parse_args()
    if (args.archive is None) != (args.key is None):
        parser.error("--archive and --key go together")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="bench-archive-attacks-"))
    try:
        bench = Bench(root)
        run_dir = genuine_run(root, args.lock.resolve())
        key = RunPaths(run_dir).receipt_public_key
        archive = genuine(bench, run_dir, key)
        if args.archive is not None:
            bench.check("the archive given", args.archive.resolve(), args.key.resolve())
        if not args.genuine_only:
            outsider(bench, archive, key)
            key_holder(bench, run_dir, key)
            scan_evasions(bench, run_dir, key)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - started
    Console(width=250).print(table(bench.rows, seconds))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in bench.rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
