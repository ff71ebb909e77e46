"""Logical attempts from the harness's event log against the proxy's physical POSTs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from runner.cells.accounting import count_logical_attempts, reconcile
from runner.proxy import ProxyCellCounts


def event(kind: str, role: str | None = None, **extra: object) -> str:
    record: dict[str, object] = {"type": kind, **extra}
    if role is not None:
        record["message"] = {"role": role}
    return json.dumps(record)


PI_LOG = [
    json.dumps({"type": "session", "version": 3}),
    event("message_start", "user"),
    event("message_end", "user"),
    event("message_start", "assistant"),
    event("message_update"),
    event("message_end", "assistant"),
    event("message_end", "toolResult"),
    event("message_end", "assistant"),
    event("agent_end"),
    "",
]


def counts(physical: int, provider: int | None = None, unsent: int = 0) -> ProxyCellCounts:
    now = datetime.now(UTC)
    return ProxyCellCounts(
        cell_id="c",
        model="m",
        provider="p",
        opened_at=now,
        closed_at=now,
        physical_posts=physical,
        unsent_posts=unsent,
        rejected_requests=0,
        provider_posts_received=provider,
        usage_returned=False,
    )


def test_only_assistant_message_ends_are_logical_attempts() -> None:
    result = count_logical_attempts(PI_LOG)
    assert (result.logical_attempts, result.unparsed_lines) == (2, 0)


def test_equal_counts_reconcile_with_no_unattributed_posts() -> None:
    result = reconcile(count_logical_attempts(PI_LOG), counts(2, provider=2))
    assert result.reconciled and result.unattributed_provider_post_requests == 0


def test_client_retries_are_unattributed_posts_not_hidden() -> None:
    result = reconcile(count_logical_attempts(PI_LOG), counts(5))
    assert result.reconciled
    assert result.unattributed_provider_post_requests == 3
    assert result.model_dump(by_alias=True)["unattributedProviderPostRequests"] == 3


def test_fewer_posts_than_attempts_fails_closed() -> None:
    result = reconcile(count_logical_attempts(PI_LOG), counts(1))
    assert not result.reconciled
    assert result.unattributed_provider_post_requests == 0
    assert "1 physical POSTs for 2 logical attempts" in result.problems[0]


def test_posts_that_could_not_be_sent_cover_attempts_but_are_no_physical_posts() -> None:
    """An unreachable provider: each attempt ended in an error on the proxy's 502."""
    result = reconcile(count_logical_attempts(PI_LOG), counts(1, unsent=1))
    assert result.reconciled
    assert (result.physical_posts, result.unsent_posts) == (1, 1)
    assert result.unattributed_provider_post_requests == 0
    short = reconcile(count_logical_attempts([*PI_LOG, *PI_LOG]), counts(1, unsent=2))
    assert "1 physical POSTs + 2 unsent for 4 logical attempts" in short.problems[0]


def test_proxy_and_provider_must_agree() -> None:
    result = reconcile(count_logical_attempts(PI_LOG), counts(2, provider=3))
    assert not result.reconciled
    assert "provider received 3" in result.problems[0]


def test_a_torn_event_log_does_not_reconcile() -> None:
    events = count_logical_attempts([*PI_LOG, '{"type": "message_end", "mess'])
    assert events.unparsed_lines == 1
    assert not reconcile(events, counts(2)).reconciled
