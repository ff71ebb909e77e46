"""Reading a Harbor trial directory copied back from the guest, and classifying the cell.

Harbor's ``result.json`` is Harbor's format, not ours: we read the few fields we judge by and
ignore the rest (``extra="ignore"`` here only).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runner.records.ledger import Outcome


class _HarborModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Timing(_HarborModel):
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def seconds(self) -> float:
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return (self.finished_at - self.started_at).total_seconds()


class _Verifier(_HarborModel):
    rewards: dict[str, float] | None = None


class _Exception(_HarborModel):
    exception_type: str
    exception_message: str


class HarborTrialResult(_HarborModel):
    verifier_result: _Verifier | None = None
    exception_info: _Exception | None = None
    environment_setup: _Timing | None = None
    agent_setup: _Timing | None = None
    agent_execution: _Timing | None = None
    verifier: _Timing | None = None

    @property
    def reward(self) -> float | None:
        rewards = self.verifier_result.rewards if self.verifier_result else None
        return None if not rewards else rewards.get("reward")

    def _phases(self) -> dict[str, _Timing | None]:
        """Harbor's phases in the order it runs them, by the names the ledger gives them."""
        return {
            "harbor_environment_setup": self.environment_setup,
            "harbor_agent_setup": self.agent_setup,
            "agent": self.agent_execution,
            "verifier": self.verifier,
        }

    def phase_seconds(self) -> dict[str, float]:
        return {name: round(timing.seconds, 3) for name, timing in self._phases().items() if timing}

    @property
    def last_phase_started(self) -> str | None:
        """The last of Harbor's phases that has a start time: where an exception struck."""
        started = [name for name, t in self._phases().items() if t and t.started_at is not None]
        return started[-1] if started else None


def find_result(trial_root: Path) -> Path | None:
    """Harbor writes ``<trials-dir>/<trial name>/result.json``; the trial name is Harbor's."""
    found = sorted(trial_root.glob("*/result.json"))
    return found[0] if found else None


def classify(
    trial_root: Path, deadline_passed: bool
) -> tuple[Outcome, str, HarborTrialResult | None]:
    """pass: reward 1; fail: reward 0; indeterminate: anything that is not a verdict."""
    if deadline_passed:
        return "indeterminate", "deadline passed: the cell was killed", None
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
        info = result.exception_info
        message = info.exception_message.strip().splitlines()[:1] or [""]
        return "indeterminate", f"infrastructure error: {info.exception_type}: {message[0]}", result
    return "indeterminate", f"no verdict (reward {reward})", result
