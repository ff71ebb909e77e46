"""A recording's lines (runner.artifacts.recording) are one union told apart by ``kind``: an
artifact served carries its artifact kind, a failed fetch ``fetch-failure``; a line of no known
kind is refused in one line naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.artifacts.recording import RecordedFailure, _Record, read_record
from runner.core.errors import RunnerError
from runner.spec.resolution import PinnedArtifact

SERVED = PinnedArtifact(
    kind="trial-python", name="bench-extra", version="2.0", url="https://x/bench_extra.whl",
    filename="bench_extra.whl", sha256="sha256:" + "a" * 64, size=3, tasks=("t1",),
)  # fmt: skip
FAILED = RecordedFailure(url="https://x/pool/b.deb", error="got sha256:00 (3 bytes)")


def test_each_line_names_its_kind_and_reads_back_as_written(tmp_path: Path) -> None:
    record = _Record(tmp_path / "trial.jsonl", "t1", "trial")
    record.write(FAILED)
    record.write(SERVED)
    kinds = [json.loads(line)["kind"] for line in record.path.read_text().splitlines()]
    assert kinds == ["fetch-failure", "trial-python"]
    assert read_record(record.path) == ((SERVED,), (FAILED,))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"url": "https://x/a", "error": "404"}', "Unable to extract tag using discriminator"),
        ('{"kind": "fetch-failed", "url": "https://x/a", "error": "404"}', "Input tag"),
        ('{"kind": "fetch-failure", "url": "https://x/a"}', "fetch-failure.error: Field required"),
    ],
    ids=["no kind", "unknown kind", "a failure without its error"],
)
def test_a_line_of_no_known_kind_is_refused_naming_its_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "build.jsonl"
    path.write_text(SERVED.model_dump_json() + "\n" + line + "\n")
    with pytest.raises(RunnerError) as refused:
        read_record(path)
    assert str(refused.value).startswith(f"{path}:2: ")
    assert problem in str(refused.value)
