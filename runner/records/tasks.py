"""``tasks.json`` of a run: the lock's tasks as the lab ran them (runner.spec.tasks), written at
preflight, so the report says per task what the lab changed without the host's cache."""

from __future__ import annotations

from runner.core.models import FrozenModel
from runner.spec.tasks import TaskDerivation


class RunTasks(FrozenModel):
    tasks: tuple[TaskDerivation, ...]
