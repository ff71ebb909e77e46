"""What the lab's mirror serves each task beyond the guest's frozen set (tasks.json's
``mirror_files``, from the run's resolution), and the report's table of it."""

from __future__ import annotations

from runner.records.run_tasks import RunTasks, task_mirror_files
from runner.report.markdown import markdown
from runner.report.run_sections import mirror_files_section
from runner.spec.resolution import PinnedArtifact


def artifact(kind: str, digit: str, size: int, tasks: tuple[str, ...]) -> PinnedArtifact:
    return PinnedArtifact.model_validate(
        {"kind": kind, "name": f"p{digit}", "version": "1", "url": f"https://x/{digit}",
         "filename": f"p{digit}", "sha256": "sha256:" + digit * 64, "size": size, "tasks": tasks}
    )  # fmt: skip


def test_each_task_is_counted_for_every_file_it_took_by_kind_and_nothing_else() -> None:
    files = task_mirror_files(
        (
            artifact("deb", "1", 10**9, ()),  # the guest's own: not a task's
            artifact("build-deb", "2", 2_000_000, ("a", "b")),
            artifact("build-deb", "3", 500_000, ("a",)),
            artifact("trial-python", "4", 300_000, ("b",)),
            artifact("build-debian-file", "5", 1_000, ("b",)),
        )
    )
    assert [(f.task, f.kind, f.files, f.size) for f in files] == [
        ("a", "build-deb", 2, 2_500_000),
        ("b", "build-deb", 1, 2_000_000),
        ("b", "build-debian-file", 1, 1_000),
        ("b", "trial-python", 1, 300_000),
    ]
    table = markdown(mirror_files_section(files))
    assert "| a | build-deb | 2 | 2.5 |" in table
    assert "| b | trial-python | 1 | 0.3 |" in table


def test_a_run_with_nothing_recorded_keeps_its_tasks_json_bytes_and_has_no_table() -> None:
    assert RunTasks(tasks=()).model_dump_json() == '{"tasks":[]}'
    assert mirror_files_section(()) == []
