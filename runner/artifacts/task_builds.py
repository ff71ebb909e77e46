"""Each task's image built once in a provisioned lab against the recording mirror, so what the
build takes beyond the frozen set is recorded under the task (``runner resolve --update LOCK
--lab LAB``).

The build is the deploy's (the task's environment/ in the guest, the local base images, no
pulls), without Podman's layer cache so every step asks the mirror, bounded by the task's own
build_timeout_sec. The Debian index offered is the guest suite's, from apt's signature-checked
lists (runner.artifacts.debian's apt state); the PyPI index is the lock's ``python_index``.
The built image is removed again: the deploy builds the frozen one from the frozen set.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner.artifacts.debian import AptState
from runner.artifacts.recording import RecordedFailure, read_record
from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.processes import stop_process
from runner.lab.layout import GUEST
from runner.lab.mirror import start_server
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport
from runner.spec.lock import Lock
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import PinnedArtifact
from runner.spec.tasks import TaskDerivation

_GUEST_WAIT_SECONDS = 60.0
_LAST_LINES = 3


@dataclass(frozen=True)
class TaskBuild:
    """One task's recorded build: what it took from upstream, and how the build ended."""

    task: str
    served: tuple[PinnedArtifact, ...]
    failed: tuple[RecordedFailure, ...]
    built: bool
    last_lines: str

    def line(self) -> str:
        debs = sum(artifact.kind == "build-deb" for artifact in self.served)
        python = len(self.served) - debs
        size = sum(artifact.size for artifact in self.served) / 1e6
        said = "built" if self.built else f"did not build ({self.last_lines})"
        refused = f"; {len(self.failed)} fetches refused" if self.failed else ""
        return (
            f"task {self.task}: {said}; recorded {debs} debs and {python} Python files "
            f"({size:.1f} MB){refused}"
        )


def suite_packages(lock: Lock, paths: CachePaths) -> bytes:
    """The guest suite's Packages index for its arch, as apt checked it against the Release
    signature (``guest.tool_suites`` are not offered: a task takes its packages from the suite)."""
    platform = GuestPlatform(lock.guest.arch)
    state = AptState(paths.apt_state(lock.guest.suite, platform.deb_arch), lock.guest,
                     platform.deb_arch)  # fmt: skip
    state.write()
    asyncio.run(state.update())
    pattern = f"*_dists_{lock.guest.suite}_main_binary-{platform.deb_arch}_Packages"
    found = sorted((state.root / "lists").glob(pattern))
    if not found:
        raise RunnerError(f"apt has no {pattern} in {state.root / 'lists'}")
    return found[0].read_bytes()


@contextmanager
def recording_mirror(
    resolution_file: Path, port: int, work: Path, task: str, debian_mirror: str,
    packages: bytes, python_index: str, suite: str,
) -> Iterator[tuple[Path, Path]]:  # fmt: skip
    """The recording mirror on ``port`` while the block runs; yields its log and record."""
    work.mkdir(parents=True, exist_ok=True)
    log, record, index = work / "mirror.jsonl", work / "record.jsonl", work / "Packages"
    record.unlink(missing_ok=True)  # this build's record alone
    index.write_bytes(packages)
    process = start_server(
        [sys.executable, "-m", "runner.artifacts.recording", "--resolution", str(resolution_file),
         "--port", str(port), "--log", str(log), "--record", str(record), "--task", task,
         "--debian-mirror", debian_mirror, "--packages", str(index),
         "--python-index", python_index, "--suite", suite],
        port,
    )  # fmt: skip
    try:
        yield log, record
    finally:
        stop_process(process, 10)


def build_command(task: str, timeout_seconds: float) -> str:
    """The task's image built from nothing cached, its output kept, the image removed again."""
    image = shlex.quote(f"localhost/bench-record-{task}:build")
    context = shlex.quote(f"{GUEST.task(task)}/environment")
    log = shlex.quote(f"{GUEST.build_logs}/{task}.record.log")
    return (
        f"mkdir -p {shlex.quote(str(GUEST.build_logs))} && "
        f"timeout --kill-after=30 {math.ceil(timeout_seconds)} podman build --no-cache "
        f"--pull=never -t {image} {context} > {log} 2>&1; status=$?; "
        f"podman rmi --force {image} >/dev/null 2>&1; tail -n {_LAST_LINES} {log}; exit $status"
    )


def lab_guest(lab: str) -> tuple[GuestTransport, int]:
    """A transport to the lab's guest (not yet connected) and the lab's mirror port."""
    state = load_lab_state(LabPaths.for_lab(lab))
    if state.mirror_port is None:
        raise RunnerError(f"lab {lab}: no mirror port in its lab.json: deploy the lab again")
    return SshTransport(
        state.ssh_host, state.ssh_port, Path(state.private_key), state.ssh_user
    ), state.mirror_port


def record_task_builds(
    lock: Lock, resolution_file: Path, lab: tuple[GuestTransport, int],
    tasks: tuple[TaskDerivation, ...], packages: bytes,
) -> tuple[TaskBuild, ...]:  # fmt: skip
    """Every task of ``tasks`` built once in the lab's guest against the recording mirror on
    the lab's mirror port, offering ``packages`` (the suite's index) beside the frozen set."""
    guest, mirror_port = lab
    builds = []
    with guest.connect(_GUEST_WAIT_SECONDS) as connected:
        for task in tasks:
            work = CachePaths.default().tmp / "recorded-builds" / task.id
            with recording_mirror(
                resolution_file, mirror_port, work, task.id, lock.guest.mirror, packages,
                lock.tools.python_index, lock.guest.suite,
            ) as (_, record):  # fmt: skip
                result = connected.exec(
                    build_command(task.id, task.settings.build_timeout_sec),
                    timeout=task.settings.build_timeout_sec + 120,
                )
            served, failed = read_record(record)
            last = " | ".join(line.strip() for line in result.stdout.strip().splitlines())
            builds.append(TaskBuild(task.id, served, failed, result.exit_code == 0, last))
    return tuple(builds)
