"""Classification of a copied-back Harbor trial: one case per data file in harbor_results/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cells.classify import classify, launched_at
from runner.guest.warm_harbor import HARBOR_LAUNCHED_AT

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


def test_harbors_start_up_and_teardown_are_timed_on_the_guests_clock(tmp_path: Path) -> None:
    """Launch (the cell's marker) to the trial's start, the last phase's end to the trial's end;
    no marker: no start-up."""
    data = json.loads((Path(__file__).parent / "harbor_results" / "pass.json").read_text())
    result = {**data["result"], "started_at": "2026-11-29T09:59:50Z"}
    result["finished_at"] = "2026-11-29T10:00:44.5Z"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "result.json").write_text(json.dumps(result))
    (tmp_path / HARBOR_LAUNCHED_AT).write_text("1795946387.75\n")  # 09:59:47.75
    _, _, read = classify(tmp_path, deadline_passed=False)
    assert read is not None
    assert read.phase_seconds(launched_at(tmp_path)) == {
        "agent": 30.0,
        "verifier": 10.0,
        "harbor_startup": 2.25,
        "harbor_teardown": 3.5,
    }
    (tmp_path / HARBOR_LAUNCHED_AT).unlink()
    assert "harbor_startup" not in read.phase_seconds(launched_at(tmp_path))


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
