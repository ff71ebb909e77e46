"""Classification of a copied-back Harbor trial: one case per data file in harbor_results/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cells.classify import classify

CASES = sorted((Path(__file__).parent / "harbor_results").glob("*.json"))


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_classify(case: Path, tmp_path: Path) -> None:
    data = json.loads(case.read_text())
    trial = tmp_path / "cell" / "trial-name"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text(json.dumps(data["result"]))
    outcome, reason, _ = classify(tmp_path / "cell", deadline_passed=False)
    assert [outcome, reason] == data["expect"]


def test_timings_become_phases(tmp_path: Path) -> None:
    data = json.loads((Path(__file__).parent / "harbor_results" / "pass.json").read_text())
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "result.json").write_text(json.dumps(data["result"]))
    _, _, result = classify(tmp_path, deadline_passed=False)
    assert result is not None
    assert result.phase_seconds() == {"agent": 30.0, "verifier": 10.0}


def test_deadline_beats_everything(tmp_path: Path) -> None:
    assert classify(tmp_path, deadline_passed=True)[:2] == (
        "indeterminate",
        "deadline passed: the cell was killed",
    )


def test_missing_or_broken_result_is_indeterminate(tmp_path: Path) -> None:
    assert classify(tmp_path, deadline_passed=False)[1] == (
        "no Harbor result.json in the trial directory"
    )
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "result.json").write_text("{not json")
    outcome, reason, _ = classify(tmp_path, deadline_passed=False)
    assert outcome == "indeterminate" and reason.startswith("unreadable Harbor result.json")
