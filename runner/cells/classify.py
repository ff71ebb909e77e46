"""Reading a Harbor trial directory copied back from the guest, and classifying the cell.

Harbor's ``result.json`` is Harbor's format, not ours: we read the few fields we judge by and
ignore the rest (``extra="ignore"`` here only).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from runner.guest.warm_harbor import HARBOR_LAUNCHED_AT, HARBOR_PROCESS, HarborProcess
from runner.records.ledger import Outcome

# How a ledger line's reason begins when the host's deadline killed the cell.
DEADLINE_REASON = "deadline passed"


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
    started_at: datetime | None = None
    finished_at: datetime | None = None
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

    def phase_seconds(self, launched_at: datetime | None = None) -> dict[str, float]:
        """Harbor's phases, and around them (on the guest's clock, as Harbor's own times):
        ``harbor_startup`` from Harbor's launch to its trial's start, ``harbor_teardown`` from
        the end of its last phase to the trial's end."""
        phases = {name: timing for name, timing in self._phases().items() if timing}
        seconds = {name: round(timing.seconds, 3) for name, timing in phases.items()}
        if launched_at is not None and self.started_at is not None:
            seconds["harbor_startup"] = round((self.started_at - launched_at).total_seconds(), 3)
        ended = [t.finished_at for t in phases.values() if t.finished_at is not None]
        if ended and self.finished_at is not None:
            seconds["harbor_teardown"] = round((self.finished_at - ended[-1]).total_seconds(), 3)
        return seconds

    @property
    def last_phase_started(self) -> str | None:
        """The last of Harbor's phases that has a start time: where an exception struck."""
        started = [name for name, t in self._phases().items() if t and t.started_at is not None]
        return started[-1] if started else None


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
        info = result.exception_info
        message = info.exception_message.strip().splitlines()[:1] or [""]
        return "indeterminate", f"infrastructure error: {info.exception_type}: {message[0]}", result
    return "indeterminate", f"no verdict (reward {reward})", result
