"""The real audit (ansible-runner, check mode) against this machine over Ansible's local
connection: the freeze's collection (its script and the live commands, run here by a local
shell) and the playbook's shell must agree on a clean state, and the audit must name each
planted drift, of the live state and of a disk (a tree under tmp_path read as the host reads a
guest's disk). No VM needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from runner.freeze import record
from runner.freeze.inventory import inventory_of, take_inventory
from runner.freeze.live import LIVE_PROBES
from runner.freeze.manifest import FreezeManifest, FreezeScope, GuestState, default_scope
from runner.lab.transport import ExecResult, GuestTransport
from runner.verify import playbook
from runner.verify.audit import audit
from runner.verify.disk import DRIFTS_FILE, DiskCheck, DiskDrifts
from runner.verify.report import VerifyReport

# The host's dpkg set, sockets, mounts and processes belong to whoever else uses the machine:
# judged elsewhere (the processes: only ours, under tmp_path).
OURS = ("disk:", "kernel:", "cmdline:", "sysctl:", "account:", "nft:", "ruleset:")
EXCLUDES = ("/var/log",)


def _unavailable() -> set[str]:
    """Live categories this machine cannot show: no kernel modules, no systemd as init."""
    missing = set()
    if not os.path.exists("/proc/modules"):
        missing.add("module")
    if not os.path.isdir("/run/systemd/system"):
        missing.add("unit")
    return missing


class LocalShell:
    """The guest transport's ``exec`` on this machine (what the freeze needs of it)."""

    def exec(
        self, command: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", command], input=stdin, capture_output=True, timeout=timeout
        )
        return ExecResult(
            command=command,
            exit_code=done.returncode,
            stdout=done.stdout.decode(),
            stderr=done.stderr.decode(),
            seconds=time.monotonic() - started,
        )


@pytest.fixture
def probes_here(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The freeze and the playbook without the categories this machine cannot show."""
    missing = _unavailable()
    monkeypatch.setattr(
        record, "LIVE_PROBES", tuple(p for p in LIVE_PROBES if p.category not in missing)
    )
    monkeypatch.setattr(
        playbook, "PROBES", tuple(p for p in playbook.PROBES if p.category not in missing)
    )
    return {p.category for p in playbook.PROBES}


@pytest.fixture
def guest_disk(tmp_path: Path) -> Path:
    root = tmp_path / "disk"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("tool v1\n")
    (root / "bin" / "tool-link").symlink_to("tool")
    (root / "opt" / "bench").mkdir(parents=True)
    (root / "opt" / "bench" / "a file.txt").write_text("a\n")
    (root / "opt" / "bench" / "link").symlink_to("a file.txt")
    (root / "var" / "log").mkdir(parents=True)
    (root / "var" / "log" / "journal").write_text("boot 1\n")
    (root / "var" / "lib" / "dpkg").mkdir(parents=True)
    (root / "var" / "lib" / "dpkg" / "status").write_text("")
    return root


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    """Two copies of sleep in a directory with a space (one frozen running, one started after),
    and the sha256 of their image."""
    tools = tmp_path / "my tools"
    tools.mkdir()
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    frozen, new = tools / "frozen-sleep", tools / "new-sleep"
    for copy in (frozen, new):
        shutil.copy2(sleep, copy)
    yield frozen, new, hashlib.sha256(sleep.read_bytes()).hexdigest()


@pytest.fixture
def frozen_listener() -> Iterator[None]:
    """A service listening through the whole test (freeze and audits), outside the ephemeral
    range: the listen probe has a key to check whatever this machine runs (a network namespace
    of its own, as the fast tier's run without the registries, has no listener at all)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 18764))
        listener.listen()
        yield


def our_drifts(report: VerifyReport, tmp_path: Path) -> list[str]:
    ours = f"process:{tmp_path}/"
    return [d.line for d in report.drifts if d.check.startswith((*OURS, ours))]


def entry(path: Path) -> str:
    info = path.lstat()
    meta = f"{stat.S_IMODE(info.st_mode):04o} {info.st_uid}:{info.st_gid}"
    if path.is_symlink():
        return f"symlink {info.st_uid}:{info.st_gid} -> {os.readlink(path)}"
    return f"file {meta} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def start(executable: Path) -> subprocess.Popen[bytes]:
    # Its own session: the probe leaves out only the session that runs it.
    return subprocess.Popen([str(executable), "300"], start_new_session=True)


@pytest.mark.usefixtures("frozen_listener")
def test_audit_passes_on_the_frozen_state_and_names_each_drift(
    tmp_path: Path,
    probes_here: set[str],
    guest_disk: Path,
    sleeper: tuple[Path, Path, str],
) -> None:
    frozen_sleep, new_sleep, sleep_sha = sleeper
    scope = FreezeScope(
        disk_excludes=EXCLUDES,
        nft_tables=("inet bench_local_never_loaded",),
        sysctl_volatile=default_scope().sysctl_volatile,
    )
    running = start(frozen_sleep)
    try:
        guest = cast(GuestTransport, LocalShell())
        collected, _ = record.collect(guest, scope)
        live = record.observe_live(guest, scope)
        observed = take_inventory(guest_disk, EXCLUDES)
        inventory = inventory_of(observed, EXCLUDES)
        manifest = FreezeManifest(
            lab="local",
            environment_fingerprint="sha256:" + "0" * 64,
            scope=scope,
            state=GuestState.of(collected, live, inventory, observed, scope),
        )
        assert manifest.state.nft_tables == {"inet bench_local_never_loaded": "absent"}
        assert manifest.state.live["process"][str(frozen_sleep)] == f"sha256:{sleep_sha}"
        disk = DiskCheck(
            inventory=inventory, read=lambda captured: take_inventory(guest_disk, EXCLUDES)
        )
        host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}

        handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
        clean = audit(manifest, host, tmp_path / "evidence", disk)
        # ansible-runner left the process's handlers alone (its default replaces them for good).
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    finally:
        running.kill()
        running.wait()
    assert our_drifts(clean, tmp_path) == []
    assert not [d for d in clean.drifts if d.check.startswith("ansible:")], clean.drifts
    # No Podman here and no waiting unit in the scope: those checks have no keys.
    with_keys = probes_here - {"podman", "container", "waiting"}
    assert {check.partition(":")[0] for check in clean.checks} == with_keys | {"disk"}
    assert {"disk:/bin", "disk:/opt", "disk:/var"} <= set(clean.checks)
    assert clean.disk_paths == len(inventory.entries) and clean.disk_seconds is not None
    events = list(Path(clean.evidence).glob("artifacts/*/job_events/*.json"))
    tasks = {json.loads(event.read_text()).get("event_data", {}).get("task") for event in events}
    assert {f"check {category}" for category in probes_here} <= tasks, "events kept as evidence"

    tool_v1 = entry(guest_disk / "bin" / "tool")
    link = guest_disk / "opt" / "bench" / "link"
    link_before = entry(link)
    task = guest_disk / "opt" / "bench" / "a file.txt"
    task_before = entry(task)
    (guest_disk / "bin" / "tool").write_text("tool v2\n")
    (guest_disk / "bin" / "new-tool").write_text("x\n")
    link.unlink()
    link.symlink_to("elsewhere")
    task.chmod(0o600)
    (guest_disk / "var" / "log" / "journal").write_text("boot 2\n")  # excluded
    running = start(new_sleep)
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 18765))
            listener.listen()
            drifted = audit(manifest, host, tmp_path / "evidence", disk)
    finally:
        running.kill()
        running.wait()

    assert sorted(our_drifts(drifted, tmp_path)) == sorted(
        [
            f"disk:/bin/new-tool: expected absent, found {entry(guest_disk / 'bin' / 'new-tool')}",
            f"disk:/bin/tool: expected {tool_v1}, found {entry(guest_disk / 'bin' / 'tool')}",
            f"disk:/opt/bench/a file.txt: expected {task_before}, found {entry(task)}",
            f"disk:/opt/bench/link: expected {link_before}, found {entry(link)}",
            f"process:{frozen_sleep}: expected sha256:{sleep_sha}, found absent",
            f"process:{new_sleep}: expected absent, found sha256:{sleep_sha}",
        ]
    )
    assert "listen:tcp/18765: expected absent, found listening" in [
        drift.line for drift in drifted.drifts
    ]
    assert not drifted.passed and os.path.isfile(Path(drifted.evidence) / "report.json")
    every = DiskDrifts.model_validate_json((Path(drifted.evidence) / DRIFTS_FILE).read_bytes())
    assert len(every.drifts) == 4


def test_an_audit_whose_ansible_cannot_start_says_so_and_keeps_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit's own tool failing is no drift of the guest: one error naming it (the report
    with its ansible:run line kept as evidence), never the speed probe's "not measured"."""
    from runner.core.errors import RunnerError
    from runner.verify import audit as audit_module
    from tests.support.freeze_factory import manifest_of

    collected = {"kernel": "6.12", "packages": {}, "images": [], "listening": []}
    manifest = manifest_of({}, collected)
    monkeypatch.setattr(audit_module, "_path_with_ansible", lambda: str(tmp_path / "nowhere"))
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    with pytest.raises(RunnerError, match="the audit could not run ansible-playbook") as raised:
        audit(manifest, host, tmp_path / "evidence", None)
    (report_path,) = (tmp_path / "evidence").glob("*/report.json")
    report = VerifyReport.model_validate_json(report_path.read_text())
    checks = [drift.check for drift in report.drifts]
    assert "ansible:run" in checks and not [c for c in checks if c.startswith("slower:")]
    assert str(report_path.parent) in str(raised.value)
