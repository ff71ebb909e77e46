"""A git task source: the lock's commit fetched into the host cache, each task's tree digested.

The commit is fetched alone (``--depth 1``) into an empty repository and its tree written to
``<cache>/tasks/<commit>/`` (git's own file modes; no ``.git``): the checkout is named by the
commit, so a later fetch of the same commit must give the same trees, and the resolution records
each task's tree digest to check exactly that. A commit the remote lacks fails closed, naming
URL and commit; so does a task id the commit has no directory for.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

from runner.artifacts.git import fetch_commit, git, git_bytes
from runner.cache.paths import CachePaths
from runner.core.archives import extract
from runner.core.errors import RunnerError
from runner.spec.lock import TaskSource
from runner.spec.resolution import ResolvedTask
from runner.spec.task_derivation import tree_digest


async def fetch_tasks(source: TaskSource, paths: CachePaths) -> tuple[ResolvedTask, ...]:
    """The source's tasks at its commit, checked out in the cache; () for a local ``path``."""
    if source.git is None or source.commit is None:
        return ()
    checkout = paths.task_checkout(source.commit)
    if not checkout.is_dir():
        await _check_out(source.git, source.commit, checkout)
    root = checkout / source.subdir
    missing = [task for task in source.ids if not (root / task / "task.toml").is_file()]
    if missing:
        raise RunnerError(
            f"tasks: commit {source.commit} of {source.git} has no task "
            f"{', '.join(missing)} (no {source.subdir or '.'}/<id>/task.toml)"
        )
    return tuple(
        ResolvedTask(id=task, commit=source.commit, tree=tree_digest(root / task))
        for task in source.ids
    )


async def _check_out(url: str, commit: str, checkout: Path) -> None:
    checkout.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="task-source-", dir=checkout.parent) as workdir:
        repo, tree = Path(workdir) / "repo", Path(workdir) / "tree"
        repo.mkdir()
        tree.mkdir()
        await git(repo, "init", "--quiet")
        await fetch_commit(repo, url, commit, "tasks")
        archive = await git_bytes(repo, "archive", "--format=tar", commit)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            extract(tar, tree)
        # Whole or not at all: a checkout dir that exists is a complete one.
        tree.rename(checkout)


def check_recorded(recorded: tuple[ResolvedTask, ...], found: tuple[ResolvedTask, ...]) -> None:
    """A fetch must give the recorded trees: any other tree fails closed, naming the task."""
    found_by_id = {task.id: task for task in found}
    for task in recorded:
        now = found_by_id.get(task.id)
        if now != task:
            tree = now.tree if now else "nothing"
            raise RunnerError(
                f"task {task.id}: commit {task.commit} gives tree {tree}, "
                f"the resolution records {task.tree}"
            )
