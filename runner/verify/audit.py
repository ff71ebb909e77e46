"""The frozen-state audit: the guest's disk read on the host (runner.verify.disk) and, beside
that read, its live state by the generated playbook run by ansible-runner, judged from its
events. The disk is read from a copy of the guest's live layer taken at one moment, so the
playbook starts as soon as that copy is taken (the guest runs on) and the two halves overlap.

The live state is read by Ansible's own SSH client, not by the Paramiko transport that built and
froze the guest: the tool that checks is independent of the tool that built. Each audit is one
ansible-runner private data dir kept as evidence::

    <evidence_dir>/<ident>/
        disk-drifts.json                            every drift of the disk (the report keeps
                                                    the first of each kind)
        project/verify.yml                          the playbook generated from the manifest
        inventory/hosts.json                        how Ansible reaches the guest (no secrets)
        artifacts/<ident>/job_events/*.json         every observation and assert, as evidence
        report.json                                 the VerifyReport built from those events
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from runner.core.errors import RunnerError
from runner.core.files import write_atomic, write_model
from runner.freeze.live import LATE_CATEGORIES, parse_speed
from runner.freeze.manifest import FreezeManifest
from runner.freeze.record import load_freeze
from runner.lab.host_key import HostKeyError, write_known_hosts
from runner.lab.state import LabState
from runner.verify.disk import DiskCheck, audit_disk, lab_disk
from runner.verify.playbook import (
    CHECK_TASK_PREFIX,
    HOST_GROUP,
    OBSERVE_LIVE_TASK,
    SPEED_TASK,
    build_playbook,
)
from runner.verify.report import Drift, VerifyReport
from runner.verify.taint import explained

PLAYBOOK = "verify.yml"
REPORT = "report.json"

# Ansible settings of the audit: no retry files or colour; one SSH connection reused per audit
# (pipelining); the guest's Python is known, so no interpreter discovery round trip.
ANSIBLE_ENV = {
    "ANSIBLE_PIPELINING": "True",
    "ANSIBLE_HOST_KEY_CHECKING": "True",
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
    "ANSIBLE_NOCOLOR": "True",
    "ANSIBLE_LOCALHOST_WARNING": "False",
    "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    # ansible-runner drops an event's result beyond 700,000 characters (sysctl's map is large).
    "MAX_EVENT_RES": str(64 << 20),
}
_CHECK_EVENTS = frozenset({"runner_on_ok", "runner_on_failed"})


def ssh_host_vars(lab: LabState) -> dict[str, Any]:
    """Ansible's SSH to the guest: loopback port forward, root, the lab key, and strict against
    the host key lab.json pins (the lab's known_hosts, written from it, and no other file)."""
    known_hosts = write_known_hosts(lab).known_hosts
    return {
        "ansible_host": lab.ssh_host,
        "ansible_port": lab.ssh_port,
        "ansible_user": lab.ssh_user,
        "ansible_ssh_private_key_file": lab.private_key,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_use_tty": False,  # raw tasks: clean stdout (no CR), no login tty
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes "
        f"-o UserKnownHostsFile={shlex.quote(str(known_hosts))} -o GlobalKnownHostsFile=/dev/null "
        "-o IdentitiesOnly=yes -o ConnectTimeout=30",
    }


def _not_cancelled() -> bool:
    return False


DiskPart = tuple[list[str], list[Drift], int, float | None]


def _disk_part(
    disk: DiskCheck, private: Path, captured: threading.Event
) -> tuple[list[str], list[Drift], int, float]:
    """The disk's checks and drifts; a disk that could not be read is a drift, not a crash.
    ``captured`` is set once the guest may be observed: its moment is taken, or the read
    ended."""
    started = time.monotonic()
    try:
        checks, drifts, paths = audit_disk(disk, private, captured.set)
    except RunnerError as error:
        checks, paths = ["disk:read"], 0
        drifts = [Drift(check="disk:read", expected="the disk read on the host", found=str(error))]
    finally:
        captured.set()
    return checks, drifts, paths, round(time.monotonic() - started, 3)


@contextlib.contextmanager
def _disk_beside(disk: DiskCheck | None, private: Path) -> Iterator[Callable[[], DiskPart]]:
    """The disk part read in a thread of its own; the context is entered once the guest runs on
    again (the playbook may run in it), and the part is had from the function it yields."""
    if disk is None:
        yield lambda: ([], [], 0, None)
        return
    captured = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="disk") as executor:
        part = executor.submit(_disk_part, disk, private, captured)
        captured.wait()
        yield part.result


def audit(
    manifest: FreezeManifest,
    host_vars: dict[str, Any],
    evidence_dir: Path,
    disk: DiskCheck | None,
) -> VerifyReport:
    """Run the audit of ``manifest`` against the host ``host_vars`` describe (and its disk, when
    ``disk`` says how to read it); the report is written into the audit's private data dir even
    when the audit could not run."""
    started = time.monotonic()
    checked_at = datetime.now(UTC)
    ident = checked_at.strftime("%Y%m%dT%H%M%S%fZ")
    private = evidence_dir / ident
    with _disk_beside(disk, private) as disk_part:
        events, status = _playbook_part(manifest, host_vars, private, ident)
        disk_checks, disk_drifts, disk_paths, disk_seconds = disk_part()
    refuse_changed_host_key(manifest.lab, events, private)
    ran = any(event.get("event") == "playbook_on_start" for event in events)
    checks, drifts = judge(events)
    drifts.extend(unrecorded(manifest))
    if ran:
        speed_checks, slower = compare_speed(manifest, events)
        checks.extend(speed_checks)
        drifts.extend(slower)
    if (status != "successful" and not drifts) or not ran:
        drifts.append(Drift(check="ansible:run", expected="successful", found=status))
    report = VerifyReport(
        lab=manifest.lab,
        freeze_manifest_sha256=manifest.sha256,
        checked_at=checked_at,
        seconds=round(time.monotonic() - started, 3),
        evidence=str(private),
        checks=(*disk_checks, *checks),
        drifts=(*disk_drifts, *drifts),
        disk_paths=disk_paths,
        disk_seconds=disk_seconds,
    )
    write_model(private / REPORT, report)
    if not ran:
        # The audit's own tool failed: not a drift of the guest, and not to be read as one.
        printed = private / "artifacts" / ident / "stdout"
        lines = printed.read_text(errors="replace").split("\n") if printed.is_file() else []
        said = next((line for line in reversed(lines) if line.strip()), status)
        raise RunnerError(f"the audit could not run ansible-playbook ({said}): {private}")
    return report


def _playbook_part(
    manifest: FreezeManifest, host_vars: dict[str, Any], private: Path, ident: str
) -> tuple[list[dict[str, Any]], str]:
    """The playbook's events and ansible-runner's status."""
    write_atomic(
        private / "project" / PLAYBOOK,
        yaml.safe_dump(build_playbook(manifest), sort_keys=False, width=1000).encode(),
    )
    inventory = {"all": {"children": {HOST_GROUP: {"hosts": {manifest.lab: host_vars}}}}}
    write_atomic(private / "inventory" / "hosts.json", json.dumps(inventory, indent=2).encode())
    result = ansible_runner.run(
        private_data_dir=str(private),
        ident=ident,
        playbook=PLAYBOOK,
        cmdline="--check",
        envvars={**ANSIBLE_ENV, "PATH": _path_with_ansible()},
        quiet=True,
        # Without one, ansible-runner installs its own SIGTERM and SIGINT handlers and leaves them
        # (ansible_runner.utils.signal_handler): after the first audit, a SIGTERM or Ctrl-C only
        # set its flag, and `runner execute` ran on (runner/core/signals.py keeps ours).
        cancel_callback=_not_cancelled,
    )
    return list(result.events), str(result.status)


def _path_with_ansible() -> str:
    """PATH with the venv's own bin first (beside this interpreter): a runner started by its
    full path finds the ansible-playbook installed with it, as one on PATH does."""
    return os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))


def audit_lab(lab: LabState, evidence_dir: Path) -> VerifyReport:
    """The whole audit of a frozen lab: its disk on the host, its live state over Ansible."""
    manifest, saved = load_freeze(lab.lab)
    return audit(manifest, ssh_host_vars(lab), evidence_dir, lab_disk(lab, manifest, saved))


# What OpenSSH prints when the guest's key is not the one in the lab's known_hosts.
_HOST_KEY_REFUSED = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")


def refuse_changed_host_key(lab: str, events: Iterable[dict[str, Any]], private: Path) -> None:
    """A guest that offered another host key is not a drift of the guest: the audit stops with
    one line naming the lab (its events in ``private`` keep ssh's own words)."""
    for event in events:
        said = _message(event.get("event_data", {}).get("res", {}))
        if event.get("event") == "runner_on_unreachable" and any(
            words in said for words in _HOST_KEY_REFUSED
        ):
            raise HostKeyError(
                f"lab {lab}: ssh refused the guest, its SSH host key is not the one pinned in"
                f" lab.json: {private}"
            )


def judge(events: Iterable[dict[str, Any]]) -> tuple[list[str], list[Drift]]:
    """Checks and drifts from the job events: each ``check <category>`` assert names the keys
    it compared and those that differ; a task that failed without leave to is a drift of
    ``ansible:<task>``."""
    checks: list[str] = []
    drifts: list[Drift] = []
    for event in events:
        data = event.get("event_data", {})
        task = str(data.get("task", ""))
        result = data.get("res", {})
        kind = event.get("event", "")
        if kind in _CHECK_EVENTS and task.startswith(CHECK_TASK_PREFIX):
            category = task.removeprefix(CHECK_TASK_PREFIX)
            said = _check_message(result)
            checks.extend(f"{category}:{key}" for key in said["checked"])
            drifts.extend(
                explained(
                    Drift(
                        check=f"{category}:{item['item']}",
                        expected=str(item["expected"]),
                        found=str(item["found"]),
                    )
                )
                for item in said["drifts"]
            )
        elif kind == "runner_on_unreachable" or (
            kind == "runner_on_failed" and not data.get("ignore_errors")
        ):
            drifts.append(Drift(check=f"ansible:{task}", expected="ok", found=_message(result)))
    return checks, drifts


def unrecorded(manifest: FreezeManifest) -> list[Drift]:
    """A live category the freeze did not record (made before the category existed): one drift
    each, never a comparison with nothing."""
    return [
        Drift(
            check=f"{category}:(freeze)",
            expected="recorded at the freeze",
            found="not recorded: this freeze predates it; run `runner freeze` again",
        )
        for category in sorted(LATE_CATEGORIES - manifest.state.live.keys())
    ]


def compare_speed(
    manifest: FreezeManifest, events: Iterable[dict[str, Any]]
) -> tuple[list[str], list[Drift]]:
    """The speed probe's figures and the live state's reading time (the ``observe`` tasks of
    the live categories, by their events' durations) against the freeze's: a figure above the
    scope's ``slower_ratio`` x the frozen one, and by ``slower_min_seconds`` at least, is a
    drift ``slower:<figure>`` naming both and the ratio."""
    frozen, scope = manifest.state.speed, manifest.scope
    if frozen is None or scope.slower_ratio <= 0:
        return [], []
    now: dict[str, float] = {}
    live_seconds = 0.0
    for event in events:
        data = event.get("event_data", {})
        if event.get("event") not in _CHECK_EVENTS:
            continue
        task = str(data.get("task", ""))
        if task == OBSERVE_LIVE_TASK:
            live_seconds += float(data.get("duration") or 0.0)
        elif task == SPEED_TASK and event.get("event") == "runner_on_ok":
            with contextlib.suppress(KeyError, ValueError):
                now["cpu"], now["disk"] = parse_speed(str(data.get("res", {}).get("stdout", "")))
    if live_seconds:
        now["live"] = live_seconds
    figures = {"cpu": frozen.cpu_seconds, "disk": frozen.disk_seconds}
    figures["live"] = frozen.live_seconds
    checks, drifts = [], []
    for name, before in figures.items():
        check = f"slower:{name}"
        checks.append(check)
        if name not in now:
            drifts.append(
                Drift(
                    check=check, expected=f"measured ({before:.2f} s frozen)", found="not measured"
                )
            )
            continue
        after = now[name]
        ratio = after / before if before > 0 else float("inf")
        if ratio > scope.slower_ratio and after - before >= scope.slower_min_seconds:
            drifts.append(
                Drift(
                    check=check,
                    expected=f"<= {scope.slower_ratio:g}x the frozen {before:.2f} s",
                    found=f"{after:.2f} s ({ratio:.1f}x)",
                )
            )
    return checks, drifts


def _check_message(result: dict[str, Any]) -> dict[str, Any]:
    try:
        said = json.loads(str(result.get("msg", "")))
        if isinstance(said, dict) and {"checked", "drifts"} <= said.keys():
            return said
    except ValueError:
        pass
    # An assert that could not evaluate (a probe's output was not what it expected).
    return {
        "checked": [],
        "drifts": [{"item": "(evaluation)", "expected": "a verdict", "found": _message(result)}],
    }


def _message(result: dict[str, Any]) -> str:
    text = str(result.get("msg") or result.get("stderr") or "failed")
    return " ".join(text.split())[:500]


def render_drifts(report: VerifyReport, limit: int = 50) -> str:
    """One line per drift (check, expected, found), at most ``limit`` lines and a count."""
    lines = [drift.line for drift in report.drifts[:limit]]
    if len(report.drifts) > limit:
        lines.append(f"... and {len(report.drifts) - limit} more drifts (see the JSON report)")
    return "\n".join(lines)
