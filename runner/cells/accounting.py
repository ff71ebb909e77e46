"""Logical attempts (the harness's own event log) against physical POSTs (the proxy's count).

A logical attempt is one assistant message the harness finished: a ``message_end`` event whose
message has role ``assistant`` in Pi's and OMP's ``--mode json`` log (an attempt that failed with
a provider error is still one, with ``stopReason: "error"``). Every logical attempt needs at
least one physical POST; POSTs beyond that (client-side retries inside one attempt, requests the
harness made on its own) are ``unattributedProviderPostRequests``: counted, never hidden. A POST
the proxy could not send (no connection to the provider) covers an attempt too: the harness saw
its 502 and ended the attempt in an error. Fewer POSTs, sent or not, than attempts means evidence
was lost, and the cell fails closed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import ConfigDict, Field, ValidationError

from runner.core.models import FrozenModel
from runner.guest.agent_plan import CONTAINER, AgentCgroup, CompiledCacheReading
from runner.proxy.models import UPSTREAM_OUTCOMES, ProxyCellCounts
from runner.records.ledger import RequestSums, unattributed_provider_post_requests


class EventLogCount(FrozenModel):
    logical_attempts: int = Field(ge=0)
    unparsed_lines: int = Field(ge=0, description="non-empty lines that are not JSON objects")
    provider_errors: int = Field(
        default=0, ge=0, description="logical attempts that ended with stopReason 'error'"
    )

    @property
    def only_provider_errors(self) -> bool:
        """The harness finished attempts, and every one of them ended in a provider error."""
        return self.logical_attempts > 0 and self.provider_errors == self.logical_attempts


class Reconciliation(FrozenModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cell_id: str
    logical_attempts: int = Field(ge=0)
    physical_posts: int = Field(ge=0)
    unsent_posts: int = Field(default=0, ge=0)
    rejected_requests: int = Field(ge=0)
    provider_posts_received: int | None = Field(default=None, ge=0)
    unattributed_provider_post_requests: int = Field(ge=0, alias="unattributedProviderPostRequests")
    problems: tuple[str, ...] = ()

    @property
    def reconciled(self) -> bool:
        return not self.problems


def count_logical_attempts(lines: Iterable[str]) -> EventLogCount:
    attempts = unparsed = errors = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            unparsed += 1
            continue
        if not isinstance(event, dict):
            unparsed += 1
            continue
        message = event.get("message")
        if (
            event.get("type") == "message_end"
            and isinstance(message, dict)
            and message.get("role") == "assistant"
        ):
            attempts += 1
            errors += message.get("stopReason") == "error"
    return EventLogCount(logical_attempts=attempts, unparsed_lines=unparsed, provider_errors=errors)


def count_logical_attempts_in(event_log: Path) -> EventLogCount:
    with event_log.open(encoding="utf-8", errors="replace") as handle:
        return count_logical_attempts(handle)


def reconcile(events: EventLogCount, proxy: ProxyCellCounts) -> Reconciliation:
    problems = []
    if proxy.physical_posts + proxy.unsent_posts < events.logical_attempts:
        unsent = f" + {proxy.unsent_posts} unsent" if proxy.unsent_posts else ""
        problems.append(
            f"{proxy.physical_posts} physical POSTs{unsent} for {events.logical_attempts} "
            "logical attempts: the proxy must have seen every attempt"
        )
    if (
        proxy.provider_posts_received is not None
        and proxy.provider_posts_received != proxy.physical_posts
    ):
        problems.append(
            f"the proxy sent {proxy.physical_posts} POSTs, the provider received "
            f"{proxy.provider_posts_received}"
        )
    if events.unparsed_lines:
        problems.append(f"{events.unparsed_lines} lines of the event log are not JSON events")
    return Reconciliation(
        cell_id=proxy.cell_id,
        logical_attempts=events.logical_attempts,
        physical_posts=proxy.physical_posts,
        unsent_posts=proxy.unsent_posts,
        rejected_requests=proxy.rejected_requests,
        provider_posts_received=proxy.provider_posts_received,
        unattributedProviderPostRequests=unattributed_provider_post_requests(
            proxy.physical_posts, events.logical_attempts
        ),
        problems=tuple(problems),
    )


def request_sums(proxy: ProxyCellCounts) -> RequestSums | None:
    """The ledger's per-cell sums of the proxy's request log; None for a record written before
    the log carried the usage split (the ledger then says "not recorded")."""
    if not proxy.per_request_accounting:
        return None
    posts = [entry for entry in proxy.requests if entry.outcome in UPSTREAM_OUTCOMES]
    return RequestSums(
        input_tokens=proxy.input_tokens,
        output_tokens=proxy.output_tokens,
        cache_read_tokens=proxy.cache_read_tokens,
        cache_write_tokens=proxy.cache_write_tokens,
        reasoning_tokens=proxy.reasoning_tokens,
        answers_with_usage=sum(
            entry.usage is not None and 200 <= entry.status < 300 for entry in posts
        ),
        request_bytes=sum(entry.request_bytes for entry in posts),
        response_bytes=sum(entry.response_bytes for entry in posts),
        latency_ms=round(sum(entry.duration_ms for entry in posts), 3),
    )


def agent_cgroup_in(trial_root: Path | None) -> AgentCgroup | None:
    """The agent container's cgroup reading the run script left in the trial's agent/ dir;
    None when there is none or it does not parse (the ledger then says "not recorded")."""
    return _reading_in(trial_root, CONTAINER.agent_cgroup.name, AgentCgroup)


def compiled_cache_in(trial_root: Path | None) -> CompiledCacheReading | None:
    """The harness's compiled cache before and after it ran, as the run script left it in the
    trial's agent/ dir; None when there is none or it does not parse ("not recorded")."""
    return _reading_in(trial_root, CONTAINER.compiled_cache.name, CompiledCacheReading)


_Reading = TypeVar("_Reading", bound=FrozenModel)


def _reading_in(trial_root: Path | None, name: str, model: type[_Reading]) -> _Reading | None:
    if trial_root is None:
        return None
    found = next(iter(sorted(trial_root.rglob(name))), None)
    if found is None:
        return None
    try:
        return model.model_validate_json(found.read_bytes())
    except ValidationError:
        return None
