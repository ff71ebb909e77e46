"""The lock's tasks as the lab runs them: found where the lock's source puts them (a local dir, or
the git commit ``runner resolve`` checked out in the host cache), derived by the lock's rules
(runner.spec.task_derivation). Deploy packs the derived trees for the guest; freeze records the
derivations; both call this, so both see the same trees.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.spec.lock import Lock
from runner.spec.resolution import ResolvedTask
from runner.spec.task_derivation import TaskDerivation, derive_task


def upstream_root(lock: Lock, paths: CachePaths) -> Path:
    """The directory holding the source's task dirs."""
    tasks = lock.tasks
    if tasks.path is not None:
        return REPO_ROOT / tasks.path / tasks.subdir
    assert tasks.commit is not None  # the lock model requires it with 'git'
    checkout = paths.task_checkout(tasks.commit)
    if not checkout.is_dir():
        raise RunnerError(
            f"tasks: commit {tasks.commit} is not in the host cache: run 'runner resolve' first"
        )
    return checkout / tasks.subdir


def derive_tasks(
    lock: Lock, recorded: tuple[ResolvedTask, ...], paths: CachePaths, work: Path
) -> list[tuple[TaskDerivation, Path]]:
    """Each task derived into ``work/<id>``; a git task whose tree is not the ``recorded`` one
    (the resolution's) fails closed: the cache was changed after ``runner resolve`` checked it."""
    root = upstream_root(lock, paths)
    trees = {task.id: task.tree for task in recorded}
    derived = []
    for task_id in lock.tasks.ids:
        derivation = derive_task(
            root / task_id, work / task_id, lock.tasks, lock.guest.arch, lock.guest.suite
        )
        expected = trees.get(task_id)
        if lock.tasks.git is not None and derivation.upstream_tree != expected:
            raise RunnerError(
                f"task {task_id}: the cached tree is {derivation.upstream_tree}, the resolution "
                f"records {expected}: run 'runner resolve'"
            )
        derived.append((derivation, work / task_id))
    return derived


def task_derivations(lock: Lock, recorded: tuple[ResolvedTask, ...]) -> tuple[TaskDerivation, ...]:
    """The derivations alone (the trees are made in a temporary directory and dropped)."""
    paths = CachePaths.default()
    paths.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="task-derivations-", dir=paths.tmp) as work:
        return tuple(
            derivation for derivation, _ in derive_tasks(lock, recorded, paths, Path(work))
        )
