"""The name of a task's image in the guest: built by provisioning from the task's environment/,
frozen with the guest, and the image every cell's task container is created from; and a task
image's build as the deploy hands it to the guest's build report (runner.guest.build_report)."""

from __future__ import annotations

from runner.core.models import FrozenModel


def task_image(task_id: str) -> str:
    return f"localhost/bench-task-{task_id}:frozen"


class TaskImageBuild(FrozenModel):
    """One task image the deploy built: one argument of the build report, as this model's JSON."""

    task: str
    image: str
    # The digest of the image's inputs: the image's ``bench.inputs`` label once built from them.
    inputs_digest: str
    build_timeout_sec: float  # the task's own (task.toml), times the lock's multiplier
    # Why the lock lets this build fail here (tasks.needs_network); "": it must build.
    tolerated: str = ""
