"""Git task sources and the declared derivation of a task, on the three real Terminal-Bench 2.1
tasks (read from ../shared/sources/terminal-bench-2.1-subset.bundle by git's URL rewriting,
tests/conftest.py; the locks keep the upstream URL)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from runner.artifacts.resolver import UnavailableArtifacts, resolve_lock
from runner.artifacts.task_source import check_recorded, fetch_tasks
from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.spec.lock import Lock, load_lock
from runner.spec.resolution import ResolvedTask
from runner.spec.task_derivation import UNTOUCHED, derive_task, tree_digest

TB21 = REPO_ROOT / "locks" / "tb21.toml"
COMMIT = "53d4071682110e8d0c7fbe6bee5d488f05891717"
# The bundle's NOTICE: Terminal-Bench's own tree sha256 of each task.
NOTICE_TREES = {
    "git-leak-recovery": "sha256:2eb01718ade14732a5e009e8cd25f8a9658e3b4a77647a4d5126d2f2083fea0f",
    "sqlite-db-truncate": "sha256:15a9a55e0a2746da2c9ae87455ccd23d13ecc271ead5f8829b613bbb93c3a76f",
    "cancel-async-tasks": "sha256:819835c83336a76a4e2732bc845d8e96bbee2a38ef8611d9d25ce2aa5616d3b9",
}


@pytest.fixture(scope="module")
def tb21() -> Lock:
    return load_lock(TB21)


@pytest.fixture(scope="module")
def checkout(
    tb21: Lock, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, tuple[ResolvedTask, ...]]:
    paths = CachePaths(tmp_path_factory.mktemp("cache"))
    tasks = asyncio.run(fetch_tasks(tb21.tasks, paths))
    return paths.task_checkout(COMMIT), tasks


def test_the_commit_is_fetched_and_each_tree_is_terminal_benchs_own_digest(checkout):
    root, tasks = checkout
    assert {task.id: task.tree for task in tasks} == NOTICE_TREES
    assert {task.commit for task in tasks} == {COMMIT}
    assert not (root / ".git").exists()  # the commit's tree only


def test_the_resolution_records_the_commit_and_the_trees(tb21, tmp_path):
    resolved = asyncio.run(
        resolve_lock(
            tb21, REPO_ROOT, CachePaths(tmp_path), Console(quiet=True), frozenset({"tasks"})
        )
    )
    assert {task.id: task.tree for task in resolved.resolution.tasks} == NOTICE_TREES


def test_a_commit_the_remote_does_not_have_fails_closed_naming_url_and_commit(tb21, tmp_path):
    missing = "d1f1920f2d817a831f466d0ff363ef795a9a3b00"  # the reference run's: not here
    lock = tb21.model_copy(update={"tasks": tb21.tasks.model_copy(update={"commit": missing})})
    with pytest.raises(UnavailableArtifacts) as failure:
        asyncio.run(
            resolve_lock(
                lock, REPO_ROOT, CachePaths(tmp_path), Console(quiet=True), frozenset({"tasks"})
            )
        )
    (line,) = failure.value.lines
    assert line.startswith(
        f"tasks: the remote {tb21.tasks.git} does not have commit {missing} (git fetch"
    )


def test_a_tree_other_than_the_recorded_one_fails_closed(checkout):
    _, tasks = checkout
    changed = (tasks[0].model_copy(update={"tree": "sha256:" + "0" * 64}), *tasks[1:])
    with pytest.raises(RunnerError, match=f"task {tasks[0].id}: commit {COMMIT} gives tree"):
        check_recorded(changed, tasks)


@pytest.mark.parametrize("task", sorted(NOTICE_TREES))
def test_derivation_drops_the_prebuilt_image_and_touches_nothing_the_agent_or_verifier_reads(
    tb21, checkout, tmp_path, task
):
    root, _ = checkout
    derivation = derive_task(root / task, tmp_path / task, tb21.tasks, "aarch64", "trixie")
    assert derivation.upstream_tree == NOTICE_TREES[task]
    assert derivation.derived_tree == tree_digest(tmp_path / task) != derivation.upstream_tree
    assert "docker_image" not in (tmp_path / task / "task.toml").read_text()
    for untouched in UNTOUCHED:
        upstream, derived = root / task / untouched, tmp_path / task / untouched
        assert (
            tree_digest(derived) == tree_digest(upstream)
            if derived.is_dir()
            else (derived.read_bytes() == upstream.read_bytes())
        )
    assert derivation.changes[0].startswith('task.toml: [environment] docker_image = "alexgshaw/')
    assert any("FROM" in change and "localhost/base:1" in change for change in derivation.changes)
    assert derivation.changes[-1].startswith("verifier: tests/test.sh runs unchanged")


def test_a_task_as_upstream_has_no_changes(tb21, checkout, tmp_path):
    root, _ = checkout
    plain = tb21.tasks.model_copy(
        update={"build_from_environment": False, "verifier": None, "base_images": {}}
    )
    derivation = derive_task(root / "git-leak-recovery", tmp_path / "t", plain, "aarch64", "trixie")
    assert (derivation.derived, derivation.derived_tree) == (False, derivation.upstream_tree)


def test_a_local_task_source_still_works(tmp_path):
    demo = load_lock(REPO_ROOT / "locks" / "demo.toml")
    assert asyncio.run(fetch_tasks(demo.tasks, CachePaths(tmp_path))) == ()
    shutil.copytree(REPO_ROOT / "tasks" / "git-leak-recovery", tmp_path / "upstream")
    derivation = derive_task(
        tmp_path / "upstream", tmp_path / "derived", demo.tasks, "aarch64", "trixie"
    )
    assert (
        derivation.upstream_tree == derivation.derived_tree
    )  # FROM bench-base: tagged, not edited


def test_a_build_timeout_multiplier_is_a_change_said_and_leaves_task_toml_as_it_was(
    tb21, checkout, tmp_path
):
    root, _ = checkout
    slower = tb21.tasks.model_copy(update={"environment_build_timeout_multiplier": 3.0})
    task = root / "git-leak-recovery"
    derivation = derive_task(task, tmp_path / "t", slower, "aarch64", "trixie")
    plain = derive_task(task, tmp_path / "p", tb21.tasks, "aarch64", "trixie")
    assert derivation.derived_tree == plain.derived_tree
    assert derivation.settings.build_timeout_sec == 600.0  # task.toml's own
    assert slower.build_timeout_sec(600.0) == 1800.0
    assert derivation.changes == (
        *plain.changes,
        "task.toml: build_timeout_sec 600 s is 1800 s here (environment_build_timeout_multiplier "
        "3, as Harbor's; the file is unchanged)",
    )
