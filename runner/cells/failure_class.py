"""Failure classes: beneath a cell's outcome (pass / fail / indeterminate), who or what ended it.

The outcome is what the cell counts as; the class says why, from evidence the runner already
holds: how the attempt ended (the runner's deadline, an exception in one of its phases, Harbor's
result.json or its absence), Harbor's verdict and ``exception_info`` (type and message), the last
of Harbor's phases that has timing, the proxy's tally of the provider's status codes and the
harness's event log (attempts ending in a provider error).

``RULES`` is a table read top to bottom: the first rule whose every pattern matches the
evidence gives the class (a pattern left ``None`` matches anything). Order matters and is
deliberate:

- the runner's own deadline and exceptions come first: nothing Harbor wrote is trusted then;
- a task the lab cannot judge (its own reference solution did not score 1 at the freeze) is
  ``unjudged_task`` whatever its verdict: a pass of it says no more of the agent than a fail;
- reward 1 is ``success`` whatever else happened;
- a verifier whose own setup failed (a package the lab's mirror does not have, a tool missing:
  runner.cells.verifier_setup) is ``verifier_setup`` before anything else Harbor says: its
  reward 0 says nothing of the agent;
- a provider that answered nothing but errors is ``model_failure`` before any Harbor exception
  it caused (the harness exiting non-zero because every request failed is not its own crash);
- Harbor's exception types, then the phase it struck in, then whether it names the agent;
- reward 0 with no exception is ``verifier_failure``: the agent finished, the verifier said no.

No result.json: Harbor writes one for every trial it gets going (exceptions included), so
without one Harbor itself did not get the trial going or died. When nothing of the agent ran
(the proxy saw no request, the event log holds no message) this is ``setup_failure``: the agent
never acted, so re-running it gives the agent no second chance. When the agent did act, who
broke it cannot be told: ``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from runner.cells.accounting import EventLogCount
from runner.core.models import FailureClass
from runner.lab.harbor_result import HarborTrialResult
from runner.proxy.models import ProxyCellCounts

Ending = Literal[
    "interrupted",  # the attempt record was left "started": the runner was killed mid-cell
    "deadline",  # the runner's cell deadline passed and it killed the cell
    "runner_error",  # one of the runner's phases raised (guest gone, a bug)
    "no_result",  # Harbor wrote no result.json
    "unreadable_result",  # result.json is not Harbor's format
    "harbor_result",  # a readable result.json
]
Verdict = Literal["pass", "fail", "none"]
# none: no request reached the provider; answered: at least one 2xx answer that the harness
# did not log as an error; errors_only: every answer an error (or every logged attempt one).
ProviderAnswers = Literal["none", "answered", "errors_only"]


@dataclass(frozen=True)
class Evidence:
    ending: Ending
    verdict: Verdict = "none"
    provider: ProviderAnswers = "none"
    agent_acted: bool = False  # the proxy saw a request or the event log holds a message
    runner_phase: str | None = None  # the runner's phase that raised
    exception: str | None = None  # Harbor's exception_info as "Type: message"
    harbor_phase: str | None = None  # the last of Harbor's phases with a start time
    verifier_setup: str | None = None  # what broke the verifier's own setup, if anything did
    unjudged: bool = False  # the lab's oracle of the task did not score 1 at the freeze


@dataclass(frozen=True)
class Rule:
    failure_class: FailureClass
    why: str
    ending: Ending | None = None
    verdict: Verdict | None = None
    provider: ProviderAnswers | None = None
    agent_acted: bool | None = None
    runner_phase: frozenset[str] | None = None
    exception: str | None = None  # a regex searched in "Type: message"; needs an exception
    harbor_phase: frozenset[str | None] | None = None
    verifier_setup: bool | None = None
    unjudged: bool | None = None

    def matches(self, evidence: Evidence) -> bool:
        equal = (
            (self.ending, evidence.ending),
            (self.verdict, evidence.verdict),
            (self.provider, evidence.provider),
            (self.agent_acted, evidence.agent_acted),
            (self.verifier_setup, evidence.verifier_setup is not None),
            (self.unjudged, evidence.unjudged),
        )
        if any(pattern is not None and pattern != value for pattern, value in equal):
            return False
        if self.runner_phase is not None and evidence.runner_phase not in self.runner_phase:
            return False
        if self.harbor_phase is not None and evidence.harbor_phase not in self.harbor_phase:
            return False
        if self.exception is None:
            return True
        found = evidence.exception
        return found is not None and re.search(self.exception, found) is not None


_BEFORE_AGENT = frozenset({None, "harbor_environment_setup", "harbor_agent_setup"})

RULES: tuple[Rule, ...] = (
    Rule("cancelled", "the attempt was interrupted before it finished", ending="interrupted"),
    Rule("timeout", "the cell's deadline passed: the runner killed it", ending="deadline"),
    Rule(
        "setup_failure",
        "the guest's reset or the cell's bearer failed before Harbor started",
        ending="runner_error",
        runner_phase=frozenset({"reset", "bearer"}),
    ),
    Rule("unknown", "the runner or the guest failed mid-cell", ending="runner_error"),
    Rule(
        "setup_failure",
        "Harbor wrote no result.json and nothing of the agent ran",
        ending="no_result",
        agent_acted=False,
    ),
    Rule("unknown", "Harbor wrote no result.json after the agent ran", ending="no_result"),
    Rule("unknown", "Harbor's result.json is unreadable", ending="unreadable_result"),
    Rule(
        "unjudged_task",
        "the lab's oracle of the task did not score 1 at the freeze: its verdict says nothing",
        unjudged=True,
    ),
    Rule("success", "reward 1", verdict="pass"),
    Rule(
        "verifier_setup",
        "the verifier's own setup failed: its verdict says nothing of the agent",
        verifier_setup=True,
    ),
    Rule("model_failure", "every provider answer was an error", provider="errors_only"),
    Rule("model_failure", "Harbor found a provider API error", exception=r"^Api\w*Error:"),
    Rule("timeout", "Harbor's agent timeout", exception=r"^AgentTimeoutError:"),
    Rule("timeout", "Harbor's verifier timeout", exception=r"^VerifierTimeoutError:"),
    Rule(
        "setup_failure",
        "Harbor could not start the environment or install the agent",
        exception=r"^(Environment|AgentSetup|DockerCompose)\w*Error:",
    ),
    Rule(
        "setup_failure",
        "the verifier could not run or wrote no reward",
        exception=r"^(RewardFile|Verifier)\w*Error:",
    ),
    Rule(
        "harness_failure",
        "the agent process exited non-zero",
        exception=r"^NonZeroAgentExitCodeError:",
    ),
    Rule(
        "setup_failure",
        "a Harbor exception before the agent ran",
        exception=".",
        harbor_phase=_BEFORE_AGENT,
    ),
    Rule(
        "harness_failure",
        "a Harbor exception while the agent ran",
        exception=".",
        harbor_phase=frozenset({"agent"}),
    ),
    Rule("harness_failure", "a Harbor exception naming the agent", exception=r"(?i)agent"),
    Rule(
        "setup_failure",
        "a Harbor exception while the verifier ran",
        exception=".",
        harbor_phase=frozenset({"verifier"}),
    ),
    Rule("verifier_failure", "the agent finished; the verifier says reward 0", verdict="fail"),
    Rule("unknown", "no rule matched (no binary verdict)"),
)


def failure_class(evidence: Evidence) -> Rule:
    """The first rule of ``RULES`` that matches; the last rule matches everything."""
    return next(rule for rule in RULES if rule.matches(evidence))


def provider_answers(
    counts: ProxyCellCounts | None, events: EventLogCount | None
) -> ProviderAnswers:
    """What the provider gave the cell, from the proxy's tally and the harness's event log."""
    if events is not None and events.only_provider_errors:
        return "errors_only"
    if counts is None or not counts.upstream_statuses:
        return "none"
    return "answered" if counts.provider_answered else "errors_only"


def harbor_evidence(
    result: HarborTrialResult | None,
    result_found: bool,
    counts: ProxyCellCounts | None,
    events: EventLogCount | None,
) -> Evidence:
    """The evidence of an attempt that ran to its classification (no deadline, no exception)."""
    provider = provider_answers(counts, events)
    acted = bool(events and events.logical_attempts) or bool(counts and counts.physical_posts)
    if result is None:
        ending: Ending = "unreadable_result" if result_found else "no_result"
        return Evidence(ending=ending, provider=provider, agent_acted=acted)
    info = result.exception_info
    verdicts: dict[float | None, Verdict] = {1: "pass", 0: "fail"}
    return Evidence(
        ending="harbor_result",
        verdict=verdicts.get(result.reward, "none"),
        provider=provider,
        agent_acted=acted,
        exception=f"{info.exception_type}: {info.exception_message}" if info else None,
        harbor_phase=result.last_phase_started,
    )
