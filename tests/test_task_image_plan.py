"""The deploy's plan of each task image (deploy.guest.plan): the build timeout is the task's
own times the lock's multiplier, and a task that needs the network is a build the deploy lets
fail, saying why; neither changes the image's inputs digest."""

from __future__ import annotations

import shutil
from pathlib import Path

from deploy.guest.plan import Bundle, _task_images
from runner.core.roots import REPO_ROOT
from runner.spec.lock import load_lock
from runner.spec.task_derivation import derive_task


def test_the_lock_sets_each_builds_timeout_and_tolerance_but_not_its_inputs(
    tmp_path: Path,
) -> None:
    demo = load_lock(REPO_ROOT / "locks" / "demo.toml").tasks
    upstream = tmp_path / "upstream" / "git-leak-recovery"
    shutil.copytree(REPO_ROOT / "tasks" / "git-leak-recovery", upstream)
    derivation = derive_task(upstream, tmp_path / "t", demo, "aarch64", "trixie")
    bundle = Bundle("task-git-leak-recovery", "sha256:t", "/srv/tasks/git-leak-recovery", "x")
    (plain,) = _task_images(((bundle, derivation),), "sha256:in", (), (), demo)
    lenient = demo.model_copy(
        update={
            "environment_build_timeout_multiplier": 2.5,
            "needs_network": {"git-leak-recovery": "its build clones from GitHub"},
        }
    )
    (image,) = _task_images(((bundle, derivation),), "sha256:in", (), (), lenient)
    own = derivation.settings.build_timeout_sec
    assert (plain.build_timeout_sec, plain.tolerated) == (own, "")
    assert (image.build_timeout_sec, image.tolerated) == (own * 2.5, "its build clones from GitHub")
    assert image.digest == plain.digest
