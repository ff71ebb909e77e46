"""The frozen identities a run directory records, as digests for the receipt to carry.

Every one is recomputed from the run's own files, so a reviewer holding the archive recomputes
the same: the image's manifest (image.json) by its bytes, the freeze manifest (freeze.json) by
the sha256 the final verify audited, which check-archive checks freeze.json against.
"""

from __future__ import annotations

from pathlib import Path

from runner.core.canonical import file_digest
from runner.core.files import read_model
from runner.records.paths import RunPaths
from runner.records.run_tasks import RunTasks
from runner.report.receipt import FrozenDigests
from runner.spec.resolution import Resolution
from runner.verify.report import VerifyReport


def _digest(path: Path) -> str | None:
    return file_digest(path) if path.is_file() else None


def frozen_digests(paths: RunPaths) -> FrozenDigests:
    resolution = read_model(paths.resolution, Resolution) if paths.resolution.is_file() else None
    tasks = read_model(paths.tasks, RunTasks).tasks if paths.tasks.is_file() else ()
    final = read_model(paths.final_verify, VerifyReport) if paths.final_verify.is_file() else None
    return FrozenDigests(
        lock_sha256=file_digest(paths.lock),
        environment_fingerprint=resolution.environment_fingerprint if resolution else None,
        resolution_sha256=_digest(paths.resolution),
        tasks_sha256=_digest(paths.tasks),
        derived_task_trees={task.id: task.derived_tree for task in tasks},
        freeze_manifest_sha256=final.freeze_manifest_sha256 if final else None,
        scan_sha256=_digest(paths.scan),
        final_verify_sha256=_digest(paths.final_verify),
        image_manifest_sha256=_digest(paths.image_manifest),
    )
