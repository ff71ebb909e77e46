"""The credential scan of the guest's disk after each attempt (runner.scan.guest_disk): only what
changed since the freeze is read, a secret there is a leak named by its guest path, cell and
attempt, and it makes the run's scan unclean and its receipt failed_closed."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from runner.core.canonical import sha256_digest
from runner.core.files import read_model, write_model
from runner.core.roots import REPO_ROOT
from runner.freeze.inventory import DiskInventory, inventory_of, take_inventory
from runner.lab.transport import GuestTransport
from runner.proxy.bearer import new_bearer
from runner.records.ledger import AttemptRecord
from runner.records.paths import RunPaths
from runner.run.execute import ExecuteOptions, execute
from runner.scan.guest_disk import (
    DiskFindings,
    GuestScan,
    guest_findings,
    record_guest_scan,
    scan_disk,
    unreadable,
)
from runner.scan.scan import Findings, Leak, ScanFailure, ScanReport, SecretKind, scan_run
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import FakeTransport, trial_tree

KEY = "sk-real-provider-key-7f3a9c2e"
EXCLUDES = ("/var/log",)


def frozen_disk(root: Path) -> DiskInventory:
    """A guest disk as the freeze left it, each file holding a secret (none was then: what is
    frozen is not scanned again, so these stand for files the freeze had as they are)."""
    for name, text in {
        "etc/frozen.conf": f"token = {new_bearer()}\n",
        "etc/touched.conf": "nothing yet\n",
        "var/log/journal": "boot\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    return inventory_of(take_inventory(root, EXCLUDES), EXCLUDES)


def test_only_what_changed_since_the_freeze_is_scanned_and_a_leak_is_named_by_its_path(
    tmp_path: Path,
) -> None:
    root = tmp_path / "disk"
    root.mkdir()
    inventory = frozen_disk(root)
    assert "/etc/frozen.conf" in inventory.ctimes and "/var/log/journal" not in inventory.ctimes
    bearer = new_bearer()  # one no proxy of this process issued: found by its shape
    (root / "root").mkdir()
    (root / "root/.bash_history").write_text(f"curl -H 'Authorization: Bearer {bearer}'\n")
    with gzip.open(root / "root/session.gz", "wt") as packed:
        packed.write(f"key={KEY}\n")
    # A file whose ctime moved since the freeze is read again (same size, same name).
    touched = root / "etc/touched.conf"
    touched.write_text(f"key {KEY}\n")
    frozen_ctime = inventory.ctimes["/etc/touched.conf"]
    if os.lstat(touched).st_ctime_ns == frozen_ctime:  # within one clock tick of the freeze
        inventory = inventory.model_copy(
            update={"ctimes": {**inventory.ctimes, "/etc/touched.conf": frozen_ctime - 1}}
        )

    findings = scan_disk(root, inventory, {"provider_key": (KEY,), "bearer": ()})

    assert sorted(findings.leaks, key=lambda leak: (leak.file, leak.kind)) == [
        Leak(file="guest:/etc/touched.conf", kind="provider_key"),
        Leak(file="guest:/root/.bash_history", kind="bearer"),
        Leak(file="guest:/root/session.gz", kind="provider_key", inside="gzip"),
    ]
    assert findings.failures == ()
    # The changed file, the two new ones and the excluded journal (the freeze did not record
    # it); not the frozen file, nor dpkg's status.
    assert findings.files == 4
    assert not any("frozen.conf" in leak.file for leak in findings.leaks)


def test_each_attempts_findings_are_named_with_cell_and_attempt(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    leak = Leak(file="guest:/root/.bash_history", kind="bearer")
    record_guest_scan(paths, "cell-a", 1, DiskFindings(3, 10, (leak,), ()))
    record_guest_scan(paths, "cell-a", 2, DiskFindings(2, 0, (), ()))
    record_guest_scan(paths, "cell-b", 1, unreadable(OSError("fusermount: no such device")))

    scan = read_model(paths.guest_scan("cell-a", 1), GuestScan)
    assert (scan.cell, scan.attempt, scan.files_scanned, scan.leaks) == ("cell-a", 1, 3, (leak,))
    assert paths.guest_scans == [
        paths.guest_scan("cell-a", 1),
        paths.guest_scan("cell-a", 2),
        paths.guest_scan("cell-b", 1),
    ]
    found = guest_findings(paths)
    assert found.leaks == (
        Leak(file="guest:/root/.bash_history (cell cell-a, attempt 1)", kind="bearer"),
    )
    assert found.failures == (
        ScanFailure(file="guest:/ (cell cell-b, attempt 1)", error="fusermount: no such device"),
    )


def test_the_guests_findings_make_the_runs_scan_unclean(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    (paths.run_dir / "ledger.jsonl").write_text("nothing secret\n")
    secrets: dict[SecretKind, tuple[str, ...]] = {"provider_key": (KEY,)}
    assert scan_run(paths, secrets).clean

    leak = Leak(file="guest:/root/x (cell c, attempt 1)", kind="provider_key")
    report = scan_run(paths, secrets, found_elsewhere=Findings(leaks=(leak,)))
    assert not report.clean and report.leaks == (leak,)
    assert read_model(paths.scan, ScanReport) == report
    failure = ScanFailure(file="guest:/ (cell c, attempt 1)", error="not mounted")
    failed = scan_run(paths, secrets, found_elsewhere=Findings(failures=(failure,)))
    assert not failed.clean and failed.failures == (failure,) and failed.leaks == ()


@dataclass
class LeakyLab(FakeLab):
    """A fake lab whose guest disk (a tree under tmp_path) gets a bearer-shaped string written
    during the attempt it scans ``leaky_scan``-th (None: never)."""

    root: Path = Path()
    inventory: DiskInventory | None = None
    asked: list[Mapping[SecretKind, tuple[str, ...]]] = field(default_factory=list)
    leaky_scan: int | None = 2

    def scan_disk(
        self,
        guest: GuestTransport,
        secrets_by_kind: Mapping[SecretKind, tuple[str, ...]],
        own_bearer: str | None = None,
    ) -> DiskFindings:
        self.asked.append(secrets_by_kind)
        if len(self.asked) == self.leaky_scan:
            (self.root / "tmp").mkdir(exist_ok=True)
            (self.root / "tmp/harbor-env").write_text(f"OPENAI_API_KEY={new_bearer()}\n")
        assert self.inventory is not None
        return scan_disk(self.root, self.inventory, secrets_by_kind, own_bearer)


def disk_lab(tmp_path: Path, kind: type[LeakyLab] = LeakyLab, **fields: object) -> LeakyLab:
    """A fake lab of ``kind`` whose guest disk is an empty frozen tree under ``tmp_path``."""
    root = tmp_path / "disk"
    root.mkdir()
    return kind(
        FakeTransport(trials=trial_tree(tmp_path / "t", "pass")),
        root=root,
        inventory=frozen_disk(root),
        **fields,  # type: ignore[arg-type]
    )


def killed_in_the_last_attempt(paths: RunPaths) -> GuestScan:
    """The run's files as a SIGKILL in its last attempt leaves them: started, never scanned, no
    ledger line, no trial copied back; the scan that is now missing."""
    last = max(paths.guest_scans, key=lambda path: path.stat().st_mtime)
    scan = read_model(last, GuestScan)
    last.unlink()
    shutil.rmtree(paths.trials_dir / scan.cell)
    lines = paths.ledger.read_text().splitlines(keepends=True)
    paths.ledger.write_text("".join(lines[:-1]))
    return scan


def test_a_secret_on_the_guests_disk_fails_the_run_closed(tmp_path: Path) -> None:
    lab = disk_lab(tmp_path)
    run_dir = tmp_path / "run"
    receipt = execute(
        ExecuteOptions(REPO_ROOT / "locks" / "demo.toml", run_dir, "fake"),
        Console(file=io.StringIO()),
        lab,
    )
    paths = RunPaths(run_dir)
    assert receipt.status == "failed_closed"
    assert receipt.credential_scan == "leaks"
    assert "credential scan: leaks" in receipt.reasons
    # One scan per attempt, each given the real keys and the bearers, never the run's canary.
    assert len(paths.guest_scans) == len(lab.asked) == 4
    assert all(set(asked) == {"provider_key", "bearer"} for asked in lab.asked)
    assert all(asked["bearer"] for asked in lab.asked)  # the attempt's own bearer at least
    scans = [read_model(path, GuestScan) for path in paths.guest_scans]
    leaky = [scan for scan in scans if scan.leaks]
    assert len(leaky) == 3  # from the second attempt on: the fake's reset keeps the disk
    assert all(scan.leaks == (Leak(file="guest:/tmp/harbor-env", kind="bearer"),) for scan in leaky)
    run_scan = json.loads(paths.scan.read_text())
    assert run_scan["clean"] is False
    assert sorted(leak["file"] for leak in run_scan["leaks"]) == sorted(
        f"guest:/tmp/harbor-env (cell {scan.cell}, attempt {scan.attempt})" for scan in leaky
    )


def test_a_resumed_run_scans_the_disk_its_killed_runner_left_before_resetting(
    tmp_path: Path,
) -> None:
    """A runner killed mid-cell never scanned that attempt's disk: the run that resumes it
    scans the guest first (the killed runner's bearers are found by their shape), for that
    attempt, and only then resets."""
    lab = disk_lab(tmp_path)
    run_dir = tmp_path / "run"
    options = ExecuteOptions(REPO_ROOT / "locks" / "demo.toml", run_dir, "fake")
    execute(options, Console(file=io.StringIO()), lab)
    paths = RunPaths(run_dir)
    scan = killed_in_the_last_attempt(paths)
    (lab.root / "tmp/harbor-env").write_text(f"export BENCH_PROXY_BEARER={new_bearer()}\n")
    resets_before = lab.resets

    execute(options, Console(file=io.StringIO()), lab)

    again = read_model(paths.guest_scan(scan.cell, scan.attempt), GuestScan)
    assert again.leaks == (Leak(file="guest:/tmp/harbor-env", kind="bearer"),)
    assert set(lab.asked[4]) == {"provider_key"}  # before the resumed run's proxy existed
    assert lab.resets > resets_before


EXEC_SPEC = "var/lib/containers/storage/overlay-containers/c0ffee/userdata/e1ec/exec-process-2731"


def test_the_cells_own_bearer_in_podmans_exec_records_is_expected_nothing_else_there(
    tmp_path: Path,
) -> None:
    """Harbor hands the agent its bearer as a `docker exec` environment, which Podman keeps in
    its database until the reset, and in the spec of an exec still in flight: the cell's own
    bearer there is named as expected; another cell's bearer or a real key there is a leak."""
    root = tmp_path / "disk"
    root.mkdir()
    inventory = frozen_disk(root)
    own, other = new_bearer(), new_bearer()
    storage = root / "var/lib/containers/storage"
    (root / EXEC_SPEC).parent.mkdir(parents=True)
    (storage / "db.sql").write_text(f"BENCH_PROXY_BEARER={own}\n")
    (root / EXEC_SPEC).write_text(json.dumps({"env": [f"BENCH_PROXY_BEARER={own}"]}))
    (storage / "db.sql-wal").write_text(f"OPENAI_API_KEY={KEY} BENCH_PROXY_BEARER={other}\n")
    (root / EXEC_SPEC).with_name("exec-process-9").write_text(f"B={other}")
    (root / "root").mkdir()
    (root / "root/.bash_history").write_text(f"echo {own}\n")

    findings = scan_disk(root, inventory, {"provider_key": (KEY,), "bearer": ()}, digest(own))

    assert sorted(findings.expected_bearers) == [
        "guest:/var/lib/containers/storage/db.sql",
        f"guest:/{EXEC_SPEC}",
    ]
    assert sorted((leak.file, leak.kind) for leak in findings.leaks) == [
        ("guest:/root/.bash_history", "bearer"),
        ("guest:/var/lib/containers/storage/db.sql-wal", "bearer"),
        ("guest:/var/lib/containers/storage/db.sql-wal", "provider_key"),
        (f"guest:/{EXEC_SPEC[:-4]}9", "bearer"),
    ]
    # Without the cell's own bearer known, none is expected.
    unknown = scan_disk(root, inventory, {"provider_key": (KEY,), "bearer": ()})
    assert unknown.expected_bearers == () and len(unknown.leaks) == 6


@dataclass
class ExecLab(LeakyLab):
    """A fake lab whose reset clears Podman's records, as the real one does."""

    def reset(self, guest: GuestTransport | None = None) -> object:
        shutil.rmtree(self.root / "var/lib/containers", ignore_errors=True)  # as a reset does
        return super().reset(guest)


def test_a_resumed_run_expects_the_killed_attempts_own_bearer_in_podmans_records(
    tmp_path: Path,
) -> None:
    """The kill/resume case of #24: the attempt in flight left its bearer in Podman's spec of
    its exec; the run that resumes knows that bearer by the digest in the attempt's record, so
    the receipt is completed, not failed_closed."""
    lab = disk_lab(tmp_path, ExecLab, leaky_scan=None)
    root = lab.root
    run_dir = tmp_path / "run"
    options = ExecuteOptions(REPO_ROOT / "locks" / "demo.toml", run_dir, "fake")
    execute(options, Console(file=io.StringIO()), lab)
    paths = RunPaths(run_dir)
    records = [read_model(path, AttemptRecord) for path in paths.attempts_dir.glob("*/attempt-*")]
    assert records and all(record.bearer_sha256 for record in records)
    # As a SIGKILL in the last attempt leaves it (see the test above), with that attempt's
    # bearer in Podman's records. Its digest stands for the killed runner's bearer.
    scan = killed_in_the_last_attempt(paths)
    killed = new_bearer()
    record_path = paths.attempt(scan.cell, scan.attempt)
    record = read_model(record_path, AttemptRecord)
    write_model(record_path, record.model_copy(update={"bearer_sha256": digest(killed)}))
    (root / EXEC_SPEC).parent.mkdir(parents=True)
    (root / EXEC_SPEC).write_text(json.dumps({"env": [f"BENCH_PROXY_BEARER={killed}"]}))

    receipt = execute(options, Console(file=io.StringIO()), lab)

    again = read_model(paths.guest_scan(scan.cell, scan.attempt), GuestScan)
    assert again.leaks == () and again.expected_bearers == (f"guest:/{EXEC_SPEC}",)
    assert receipt.status == "completed"


def digest(bearer: str) -> str:
    return sha256_digest(bearer.encode())
