"""Reading a Harbor trial directory copied back from the guest, and classifying the cell."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from runner.guest.warm_harbor import HARBOR_LAUNCHED_AT, HARBOR_PROCESS, HarborProcess
from runner.lab.harbor_result import HarborTrialResult
from runner.records.ledger import Outcome

# How a ledger line's reason begins when the host's deadline killed the cell.
DEADLINE_REASON = "deadline passed"


def launched_at(trial_root: Path) -> datetime | None:
    """When the cell launched Harbor, on the guest's clock (the cell's command writes it)."""
    marker = trial_root / HARBOR_LAUNCHED_AT
    try:
        return datetime.fromtimestamp(float(marker.read_text()), UTC)
    except (OSError, ValueError):
        return None


def harbor_process(trial_root: Path) -> HarborProcess | None:
    """Whether the cell's Harbor was the warm process or a cold start (the cell's command says)."""
    try:
        said = (trial_root / HARBOR_PROCESS).read_text().strip()
    except OSError:
        return None
    return "warm" if said == "warm" else "cold" if said == "cold" else None


def find_result(trial_root: Path) -> Path | None:
    """Harbor writes ``<trials-dir>/<trial name>/result.json``; the trial name is Harbor's."""
    found = sorted(trial_root.glob("*/result.json"))
    return found[0] if found else None


def classify(
    trial_root: Path, deadline_passed: bool
) -> tuple[Outcome, str, HarborTrialResult | None]:
    """pass: reward 1; fail: reward 0; indeterminate: anything that is not a verdict."""
    if deadline_passed:
        return "indeterminate", f"{DEADLINE_REASON}: the cell was killed", None
    path = find_result(trial_root)
    if path is None:
        return "indeterminate", "no Harbor result.json in the trial directory", None
    try:
        result = HarborTrialResult.model_validate_json(path.read_bytes())
    except ValidationError as error:
        return "indeterminate", f"unreadable Harbor result.json: {error.errors()[0]['msg']}", None
    reward = result.reward
    if reward == 1:
        return "pass", "reward 1", result
    if reward == 0:
        return "fail", "reward 0", result
    if result.exception_info is not None:
        return "indeterminate", f"infrastructure error: {result.exception_info.summary}", result
    return "indeterminate", f"no verdict (reward {reward})", result
