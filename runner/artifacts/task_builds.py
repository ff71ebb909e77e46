"""Each task built once in a provisioned lab against the recording mirror, then its oracle run
on that image, so what the build and the trial take beyond the frozen set is recorded under the
task (``runner resolve LOCK --lab LAB``).

The build is the deploy's (the task's environment/ in the guest, the local base images, no
pulls), without Podman's layer cache so every step asks the mirror, bounded by the task's own
build_timeout_sec. The trial is the freeze's oracle (runner.lab.oracle_run): the task's reference
solution and its verifier, whose installs (a solution's ``pip install``, a verifier's ``uvx -w``
or ``apt-get install``) the cells' mirror must then serve too. The Debian index offered is the
guest suite's, from apt's signature-checked lists (runner.artifacts.debian's apt state); the
PyPI index is the lock's ``python_index``. The image and the trial are removed again: the deploy
builds the frozen image from the frozen set, and the freeze runs its oracle on that.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from runner.artifacts.debian import AptState
from runner.artifacts.recording import RecordedFailure, read_record
from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.processes import start_listening, stop_process
from runner.guest.task_images import task_image
from runner.lab.layout import GUEST
from runner.lab.mirror import READY_SECONDS
from runner.lab.oracle_run import ORACLE_TRIALS, OracleRun, scored_oracle
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport
from runner.spec.lock import Lock
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import PinnedArtifact
from runner.spec.task_derivation import TaskDerivation

_GUEST_WAIT_SECONDS = 60.0
_LAST_LINES = 3


@dataclass(frozen=True)
class Recorded:
    """What one phase of a task (its build, or its trial) took from upstream."""

    served: tuple[PinnedArtifact, ...]
    failed: tuple[RecordedFailure, ...]

    def summary(self) -> str:
        debs = sum(artifact.kind.endswith("-deb") for artifact in self.served)
        python = sum(artifact.kind.endswith("-python") for artifact in self.served)
        archive = len(self.served) - debs - python  # *-debian-file: taken by archive path
        size = sum(artifact.size for artifact in self.served) / 1e6
        by_path = f", {archive} Debian archive files" if archive else ""
        refused = f"; {len(self.failed)} fetches refused" if self.failed else ""
        return f"{debs} debs and {python} Python files{by_path} ({size:.1f} MB){refused}"


@dataclass(frozen=True)
class TaskBuild:
    """One task's recording: its build and how it ended, then (when it built) its oracle's
    trial on that image and its score."""

    task: str
    build: Recorded
    built: bool
    last_lines: str
    trial: Recorded | None = None
    oracle: OracleRun | None = None

    @property
    def served(self) -> tuple[PinnedArtifact, ...]:
        return self.build.served + (self.trial.served if self.trial else ())

    def line(self) -> str:
        said = "built" if self.built else f"did not build ({self.last_lines})"
        line = f"task {self.task}: {said}; its build took {self.build.summary()}"
        if self.trial is not None and self.oracle is not None:
            line += f"; its oracle {self.oracle.outcome()} and took {self.trial.summary()}"
            if self.oracle.reward != 1:
                line += f" ({self.oracle.reason()})"
        return line


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


@dataclass(frozen=True)
class RecordingSources:
    """Where a recording takes what the frozen set lacks: the Debian suite's index (as apt
    checked it) and mirror, and the PyPI index."""

    debian_mirror: str
    packages: bytes
    python_index: str
    suite: str

    @classmethod
    def of_lock(cls, lock: Lock, packages: bytes) -> RecordingSources:
        return cls(lock.guest.mirror, packages, lock.tools.python_index, lock.guest.suite)


@contextmanager
def recording_mirror(
    resolution_file: Path, port: int, work: Path, task: str, phase: str,
    sources: RecordingSources,
) -> Iterator[tuple[Path, Path]]:  # fmt: skip
    """The recording mirror of ``task``'s ``phase`` on ``port`` while the block runs; yields
    its log and its record (read them after the block)."""
    work.mkdir(parents=True, exist_ok=True)
    log, record, index = work / f"{phase}.mirror.jsonl", work / f"{phase}.jsonl", work / "Packages"
    record.unlink(missing_ok=True)  # this phase's record alone
    index.write_bytes(sources.packages)
    process = start_listening(
        [sys.executable, "-m", "runner.artifacts.recording", "--resolution", str(resolution_file),
         "--port", str(port), "--log", str(log), "--record", str(record), "--task", task,
         "--phase", phase, "--debian-mirror", sources.debian_mirror, "--packages", str(index),
         "--python-index", sources.python_index, "--suite", sources.suite],
        port, "the recording mirror", READY_SECONDS,
    )  # fmt: skip
    try:
        yield log, record
    finally:
        stop_process(process, 10)


def build_command(task: str, timeout_seconds: float) -> str:
    """The task's image built from nothing cached under the name its trials use, its output
    kept in the guest's build logs; the last lines printed."""
    image = shlex.quote(task_image(task))
    context = shlex.quote(f"{GUEST.task(task)}/environment")
    log = shlex.quote(f"{GUEST.build_logs}/{task}.record.log")
    return (
        f"mkdir -p {shlex.quote(str(GUEST.build_logs))} && "
        f"timeout --kill-after=30 {math.ceil(timeout_seconds)} podman build --no-cache "
        f"--pull=never -t {image} {context} > {log} 2>&1; status=$?; "
        f"tail -n {_LAST_LINES} {log}; exit $status"
    )


def removal_command(task: str) -> str:
    """The recorded image and the oracle's trials removed again: the deploy builds the task's
    image from the frozen set, the freeze runs its oracle on that."""
    return (
        f"podman rmi --force {shlex.quote(task_image(task))} >/dev/null 2>&1; "
        f"rm -rf {shlex.quote(str(ORACLE_TRIALS))}"
    )


def lab_guest(lab: str) -> tuple[GuestTransport, int]:
    """A transport to the lab's guest (not yet connected) and the lab's mirror port."""
    state = load_lab_state(LabPaths.for_lab(lab))
    if state.mirror_port is None:
        raise RunnerError(f"lab {lab}: no mirror port in its lab.json: deploy the lab again")
    return SshTransport.for_lab(state), state.mirror_port


def record_task_builds(
    lock: Lock, resolution_file: Path, lab: tuple[GuestTransport, int],
    tasks: tuple[TaskDerivation, ...], packages: bytes,
) -> tuple[TaskBuild, ...]:  # fmt: skip
    """Every task of ``tasks`` built once in the lab's guest against the recording mirror on
    the lab's mirror port, offering ``packages`` (the suite's index) beside the frozen set; each
    that built then runs its oracle on that image against a recording of its trial."""
    guest, mirror_port = lab
    sources = RecordingSources.of_lock(lock, packages)
    builds = []
    with guest.connect(_GUEST_WAIT_SECONDS) as connected:
        for task in tasks:
            work = CachePaths.default().tmp / "recorded-builds" / task.id
            record = partial(recording_mirror, resolution_file, mirror_port, work, task.id)
            timeout = lock.tasks.build_timeout_sec(task.settings.build_timeout_sec)
            try:
                with record("build", sources) as (_, build_record):
                    result = connected.exec(build_command(task.id, timeout), timeout=timeout + 120)
                build = Recorded(*read_record(build_record))
                last = " | ".join(line.strip() for line in result.stdout.strip().splitlines())
                if result.exit_code != 0:
                    builds.append(TaskBuild(task.id, build, False, last))
                    continue
                with record("trial", sources) as (_, trial_record):
                    oracle = scored_oracle(connected, task.id)
                trial = Recorded(*read_record(trial_record))
                builds.append(TaskBuild(task.id, build, True, last, trial, oracle))
            finally:
                connected.exec(removal_command(task.id), timeout=300)
    return tuple(builds)
