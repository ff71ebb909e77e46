"""Opening a run directory: a new one is stamped with the lock, its resolution and the schedule;
an existing one is resumed only when lock and schedule are exactly what was recorded, with the
resolution recorded at the start (so the run's environment fingerprint never moves)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.core.canonical import canonical_json
from runner.core.errors import InputError
from runner.core.files import read_model, write_atomic
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule, build_schedule
from runner.spec.lock import Lock, load_lock
from runner.spec.resolution import load_resolution, resolution_path


@dataclass(frozen=True)
class OpenRun:
    lock: Lock
    schedule: Schedule
    paths: RunPaths
    resumed: bool


def open_run(lock_path: Path | None, run_dir: Path) -> OpenRun:
    """With ``lock_path`` None, resume from the lock recorded in ``run_dir``."""
    paths = RunPaths(run_dir)
    recorded = paths.lock.exists()
    if lock_path is None and not recorded:
        raise InputError(f"{run_dir}: no lock recorded here; give the LOCK to start a run")
    lock = load_lock(lock_path or paths.lock)
    schedule = build_schedule(lock)
    if recorded:
        previous = load_lock(paths.lock)
        if previous.fingerprint != lock.fingerprint:
            raise InputError(
                f"{run_dir}: started with lock {previous.fingerprint}, not {lock.fingerprint}; "
                "refusing to resume with another lock"
            )
        previous_schedule = read_model(paths.schedule, Schedule)
        if previous_schedule.sha256 != schedule.sha256:
            raise InputError(
                f"{paths.schedule}: schedule {previous_schedule.sha256} is not the lock's "
                f"schedule {schedule.sha256}; refusing to resume"
            )
        return OpenRun(_resolved(lock, lock_path, paths), schedule, paths, resumed=True)
    assert lock_path is not None
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.lock, lock_path.read_bytes())
    write_atomic(paths.schedule, canonical_json(schedule))
    return OpenRun(_resolved(lock, lock_path, paths), schedule, paths, resumed=False)


def _resolved(lock: Lock, lock_path: Path | None, paths: RunPaths) -> Lock:
    """The lock knowing its environment fingerprint: from the resolution recorded in the run,
    else from the one beside the lock (recorded now). Without either the run still opens, but
    its environment is unknown and ``runner execute`` refuses it."""
    source = paths.resolution
    if not source.is_file():
        if lock_path is None or not resolution_path(lock_path, lock).is_file():
            return lock
        source = resolution_path(lock_path, lock)
    resolution = load_resolution(source, lock, lock_path)
    if source != paths.resolution:
        write_atomic(paths.resolution, source.read_bytes())
    return lock.with_environment(resolution.environment_fingerprint)
