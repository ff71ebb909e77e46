"""Harbor's ``result.json`` for one trial, the few fields we judge by: its reward, its exception
and its phases' times (Harbor 0.20.0's ``harbor.models.trial.result.TrialResult``).

It is Harbor's file, not ours: each model ignores the fields it does not name
(``extra="ignore"``, unlike our own on-disk formats), so a Harbor that adds a field is still read.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


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

    @property
    def summary(self) -> str:
        """``Type: the message's first line`` (a message may hold a whole traceback)."""
        first = (self.exception_message.strip().splitlines() or [""])[0]
        return f"{self.exception_type}: {first}"


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
