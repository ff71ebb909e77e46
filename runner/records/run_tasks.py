"""``tasks.json`` of a run: the lock's tasks as the lab ran them (runner.spec.task_derivation),
written at preflight, so the report says per task what the lab changed without the host's cache,
and what the lab's mirror serves each task beyond the guest's own frozen set (what its image build
and its trial took when they were recorded: ``runner resolve LOCK --lab LAB``)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from runner.core.models import FrozenModel, Slug
from runner.spec.resolution import RECORDED_KINDS, ArtifactKind, PinnedArtifact
from runner.spec.task_derivation import TaskDerivation


class TaskMirrorFiles(FrozenModel):
    """The files of one recorded kind the lab's mirror serves one task."""

    task: Slug
    kind: ArtifactKind = Field(description="build-* (its image build) or trial-* (its oracle)")
    files: int = Field(ge=1)
    size: int = Field(ge=0, description="bytes, all files together")


class RunTasks(FrozenModel):
    tasks: tuple[TaskDerivation, ...]
    mirror_files: tuple[TaskMirrorFiles, ...] = ()

    LATE_FIELDS = frozenset({"mirror_files"})


def task_mirror_files(artifacts: Iterable[PinnedArtifact]) -> tuple[TaskMirrorFiles, ...]:
    """Per task and recorded kind, how many files of the resolution the mirror serves it."""
    totals: dict[tuple[str, ArtifactKind], tuple[int, int]] = {}
    for artifact in artifacts:
        if artifact.kind not in RECORDED_KINDS:
            continue
        for task in artifact.tasks:
            files, size = totals.get((task, artifact.kind), (0, 0))
            totals[task, artifact.kind] = (files + 1, size + artifact.size)
    return tuple(
        TaskMirrorFiles(task=task, kind=kind, files=files, size=size)
        for (task, kind), (files, size) in sorted(totals.items())
    )
