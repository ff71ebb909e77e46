"""The name of a task's image in the guest: built by provisioning from the task's environment/,
frozen with the guest, and the image every cell's task container is created from."""

from __future__ import annotations


def task_image(task_id: str) -> str:
    return f"localhost/bench-task-{task_id}:frozen"
