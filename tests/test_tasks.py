"""The repository's own tasks (tasks/): each one, built and judged as Harbor would, without Podman.

A task's environment is "built" by playing its Dockerfile (FROM, WORKDIR, COPY, RUN only) into a
directory that stands in for the container's root; commands run there under ``chroot`` with the
host's /usr and /etc bound read-only, much as the guest's base image is its own /usr and /etc.
The answer is played the way the scripted provider plays it (the script's text as one bash
call in the working directory), then tests/ is copied to /tests and /tests/test.sh runs; the
reward is what it wrote to /logs/verifier/reward.txt.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.standin_container import (
    DEMO_LOCK,
    TASKS,
    StandInContainer,
    dockerfile_instructions,
    needs_chroot,
)

TASK_IDS = DEMO_LOCK.tasks.ids


def judge(task_id: str, answer: str | None, root: Path) -> tuple[str, str]:
    """Build the task, play ``answer`` (a script in solution/, or nothing), return the reward."""
    task = TASKS / task_id
    container = StandInContainer.empty(root)
    container.play_dockerfile(task / "environment")
    if answer is not None:
        container.run((task / "solution" / answer).read_text())
    container.copy_in(task / "tests", "/tests")
    container.run("chmod +x /tests/test.sh && /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1")
    stdout = (root / "logs/verifier/test-stdout.txt").read_text()
    return container.reward(), "\n".join(container.log) + stdout


@needs_chroot
@pytest.mark.parametrize("task_id", TASK_IDS)
@pytest.mark.parametrize(
    ("answer", "reward"),
    [("solve.sh", "1"), ("fail.sh", "0"), (None, "0")],
    ids=["reference-solution", "scripted-failure", "no-answer"],
)
def test_verifier_rewards_only_the_reference_solution(
    task_id: str, answer: str | None, reward: str, tmp_path: Path
) -> None:
    got, transcript = judge(task_id, answer, tmp_path / "root")
    assert got == reward, transcript


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_task_has_harbor_layout(task_id: str) -> None:
    task = TASKS / task_id
    for name in (
        "task.toml",
        "instruction.md",
        "environment/Dockerfile",
        "tests/test.sh",
        "solution/solve.sh",
        "solution/fail.sh",
    ):
        assert (task / name).is_file(), f"{task_id}: missing {name}"
    assert (task / "instruction.md").read_text().strip()
    config = tomllib.loads((task / "task.toml").read_text())
    assert config["verifier"]["timeout_sec"] > 0
    assert os.access(task / "tests" / "test.sh", os.X_OK)


def test_every_from_is_a_mapped_local_base_image() -> None:
    froms = {
        argument
        for task_id in TASK_IDS
        for instruction, argument in dockerfile_instructions(
            TASKS / task_id / "environment" / "Dockerfile"
        )
        if instruction == "FROM"
    }
    assert froms <= set(DEMO_LOCK.tasks.base_images)
    assert all(DEMO_LOCK.tasks.base_images[name].startswith("localhost/") for name in froms)


# registry: the Harbor venv is pip-installed from PyPI (tests/support/harbor_venv.py).
@pytest.mark.registry
def test_harbor_reads_every_task_without_warnings(harbor_python: Path) -> None:
    read = (
        "import sys\n"
        "from harbor.models.task.task import Task\n"
        "for path in sys.argv[1:]:\n"
        "    task = Task(path)\n"
        "    print(task.paths.discovered_test_path.name, task.paths.discovered_solve_path.name)\n"
    )
    done = subprocess.run(
        [str(harbor_python), "-W", "error", "-c", read, *(str(TASKS / t) for t in TASK_IDS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["test.sh solve.sh"] * len(TASK_IDS)
