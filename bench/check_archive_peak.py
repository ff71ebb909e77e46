"""What ``runner check-archive`` costs at its peak: memory (the largest resident set of the
check's process), disk (the most its scratch directory held) and seconds, on a genuine archive
and on hostile ones built from it:

- ``genuine``: the archive of a finished run (the demo lock's cells on the fast tests' fake
  guest, tests/support/fake_lab.py; or ``--archive FILE`` for a real run's, with ``--key``);
- ``zeros-2gib``: the genuine members plus one declared 2 GiB of zeros (its gzip a few MiB),
  a member the signed manifest does not list;
- ``bomb-150mib``: the genuine members plus 150 MiB of zeros under a listed member's name
  placed first (a duplicate name).

Each hostile archive must be refused; what it cost before the refusal is the figure. Nothing
here is a pass/fail speed test.

    python -m bench.check_archive_peak [--archive FILE --key FILE]   (from the checkout)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from runner.core.roots import CACHE_ENV, REPO_ROOT
from runner.records.paths import RunPaths
from runner.run.archive import write_archive
from runner.run.execute import ExecuteOptions, execute
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import FakeTransport, trial_tree

DEMO = REPO_ROOT / "locks" / "demo.toml"
RUNNER = [sys.executable, "-c", "from runner.cli.main import main; main()"]


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read in pieces (nothing of it held at once)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def genuine_run(root: Path) -> tuple[Path, Path]:
    """A finished demo run on the fake guest, archived: (archive, the operator's public key)."""
    os.environ[CACHE_ENV] = str(root / "cache")
    lab = FakeLab(FakeTransport(trials=trial_tree(root / "t", "fail")))
    receipt = execute(ExecuteOptions(DEMO, root / "run", "fake"), Console(file=io.StringIO()), lab)
    assert receipt.status == "completed", receipt.reasons
    archive = root / "run.tar.gz"
    write_archive(root / "run", archive)
    return archive, RunPaths(root / "run").receipt_public_key


def with_extra_member(archive: Path, out: Path, name: str, size: int, first: bool) -> Path:
    """``archive``'s members with one more of ``size`` zeros named ``name`` (first or last)."""
    extra = tarfile.TarInfo(name)
    extra.size = size
    with tarfile.open(archive, "r:gz") as source, tarfile.open(out, "w:gz") as target:
        members = [(m, source.extractfile(m)) for m in source.getmembers()]
        if first:
            target.addfile(extra, io.BufferedReader(Zeros(size), 1 << 20))
        for member, data in members:
            target.addfile(member, data)
        if not first:
            target.addfile(extra, io.BufferedReader(Zeros(size), 1 << 20))
    return out


def disk_used(directory: Path) -> int:
    used = 0
    for top, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while walked
                used += os.lstat(os.path.join(top, name)).st_blocks * 512
    return used


def peak_disk(directory: Path, stop: threading.Event, seen: list[int]) -> None:
    while not stop.is_set():
        seen.append(disk_used(directory))
        time.sleep(0.02)


def measured(archive: Path, key: Path, scratch: Path) -> Iterator[str]:
    """One check-archive under GNU time, its scratch directory watched."""
    scratch.mkdir()
    stop, seen = threading.Event(), [0]
    watcher = threading.Thread(target=peak_disk, args=(scratch, stop, seen), daemon=True)
    watcher.start()
    started = time.monotonic()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *RUNNER, "check-archive", str(archive), "--key", str(key)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        check=False,
    )
    seconds = time.monotonic() - started
    stop.set()
    watcher.join()
    peak_rss_kib = int(done.stderr.strip().splitlines()[-1])
    verdict = (done.stdout.strip() or done.stderr.strip().splitlines()[0])[:160]
    yield f"  exit {done.returncode} in {seconds:.1f} s: {verdict}"
    yield (
        f"  peak memory {peak_rss_kib / 1024:.0f} MiB, peak scratch disk "
        f"{max(seen) / (1 << 20):.1f} MiB, archive {archive.stat().st_size / (1 << 20):.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="a real run's archive (default: the fake's)")
    parser.add_argument("--key", type=Path, help="the operator's public key for --archive")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-check-archive-"))
    try:
        if args.archive is not None:
            if args.key is None:
                parser.error("--archive needs --key")
            archive, key = args.archive, args.key
        else:
            archive, key = genuine_run(root)
        with tarfile.open(archive, "r:gz") as tar:
            ledger = next(m.name for m in tar.getmembers() if m.name.endswith("/cells.jsonl"))
        cases = {
            "genuine": archive,
            "zeros-2gib": with_extra_member(
                archive, root / "zeros.tar.gz", ledger.replace("cells.jsonl", "big.bin"),
                2 << 30, first=False,
            ),
            "bomb-150mib": with_extra_member(
                archive, root / "bomb.tar.gz", ledger, 150 << 20, first=True
            ),
        }  # fmt: skip
        for name, case in cases.items():
            print(name)
            for line in measured(case, key, root / f"scratch-{name}"):
                print(line)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
