"""Per harness: requests per cell, tokens and bytes and latency per request, the agent's cost.

Two kinds of figure, kept apart: what the provider reported (tokens, split as it returned them)
and what was measured here (the proxy's count, bytes and latency of each physical POST; the
agent container's CPU time and peak memory from its cgroup). Each figure says how many of its
requests (or cells) had it recorded at all, so a renderer can tell "not recorded" (files written
before the field existed) from "not returned" (recorded, but the provider's answers lacked it).
``runner.report.stats`` computes every number; renderers only format them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from runner.core.models import FrozenModel
from runner.proxy.models import UPSTREAM_OUTCOMES, USAGE_SPLIT, ProxyCellCounts, RequestLogEntry
from runner.records.ledger import LedgerLine
from runner.report import stats
from runner.report.stats import Spread
from runner.spec.lock import Lock

Source = Literal["provider", "proxy", "agent cgroup", "agent phase and proxy"]
Per = Literal["request", "cell"]


class Figure(FrozenModel):
    """One quantity's spread over ``spread.n`` of the ``recorded`` requests or cells whose
    records can carry it, of ``of`` in all. ``recorded`` 0: not recorded; ``spread.n`` 0 with
    ``recorded`` > 0: recorded, never returned."""

    name: str
    source: Source
    per: Per
    unit: str
    recorded: int
    of: int
    spread: Spread


class HarnessRequests(FrozenModel):
    LATE_FIELDS = frozenset({"start_up"})

    harness: str
    label: str
    cells: int
    requests: int  # physical POSTs in the proxy records read
    provider_reported: tuple[Figure, ...]
    measured: tuple[Figure, ...]
    # Start-up apart from work per cell (start_up_figures); () in receipts written before it.
    start_up: tuple[Figure, ...] = ()


# Who may have a value: a forwarded POST for bytes and latency, a 2xx answer for usage.
def physical_posts(record: ProxyCellCounts) -> list[RequestLogEntry]:
    return [entry for entry in record.requests if entry.outcome in UPSTREAM_OUTCOMES]


def answered(record: ProxyCellCounts) -> list[RequestLogEntry]:
    return [
        entry
        for entry in physical_posts(record)
        if entry.outcome == "forwarded" and 200 <= entry.status < 300
    ]


# Fields of TokenUsage that records from before the split already carried.
_USAGE_ALWAYS_RECORDED = frozenset({"input_tokens", "output_tokens"})


def _figure(
    name: str,
    source: Source,
    per: Per,
    unit: str,
    found: Iterable[tuple[bool, float | None]],
) -> Figure:
    """``found``: (recorded, value) per request or cell."""
    pairs = list(found)
    kept = [value for recorded, value in pairs if recorded and value is not None]
    return Figure(
        name=name,
        source=source,
        per=per,
        unit=unit,
        recorded=sum(recorded for recorded, _ in pairs),
        of=len(pairs),
        spread=stats.spread(kept),
    )


def _token_figure(field: str, records: list[ProxyCellCounts]) -> Figure:
    always = field in _USAGE_ALWAYS_RECORDED
    found = (
        (always or record.per_request_accounting, getattr(entry.usage, field, None))
        for record in records
        for entry in answered(record)
    )
    name = field.removesuffix("_tokens").replace("_", " ")
    return _figure(name, "provider", "request", "tokens", found)


def _request_figure(
    name: str,
    unit: str,
    value: Callable[[RequestLogEntry], float | None],
    records: list[ProxyCellCounts],
    always: bool = True,
) -> Figure:
    found = (
        (always or record.per_request_accounting, value(entry))
        for record in records
        for entry in physical_posts(record)
    )
    return _figure(name, "proxy", "request", unit, found)


def _cell_figure(
    name: str,
    source: Source,
    unit: str,
    value: Callable[[LedgerLine], float | None],
    lines: list[LedgerLine],
) -> Figure:
    # A cell's value is recorded when its line has it: lines never write a None of these.
    found = ((value(line) is not None, value(line)) for line in lines)
    return _figure(name, source, "cell", unit, found)


def _cpu_seconds(line: LedgerLine) -> float | None:
    return line.agent_cpu_seconds


def _memory_mib(line: LedgerLine) -> float | None:
    peak = line.agent_peak_memory_bytes
    return None if peak is None else peak / 2**20


def start_up_figures(lines: list[LedgerLine]) -> tuple[Figure, Figure]:
    """Start-up apart from work, per cell: the agent phase's start to the first model request,
    and the agent's time after it (runner.cells.cell.start_up)."""
    return (
        _cell_figure(
            START_UP_FIGURE,
            "agent phase and proxy",
            "s",
            lambda line: line.time_to_first_request_seconds,
            lines,
        ),
        _cell_figure(
            WORK_FIGURE,
            "agent phase and proxy",
            "s",
            lambda line: line.agent_after_first_request_seconds,
            lines,
        ),
    )


START_UP_FIGURE = "agent start to first request"
WORK_FIGURE = "agent after first request"


def harness_requests(
    harness: str, label: str, lines: list[LedgerLine], records: list[ProxyCellCounts]
) -> HarnessRequests:
    measured = (
        _cell_figure("physical POSTs", "proxy", "", lambda line: line.physical_posts, lines),
        _request_figure("request", "bytes", lambda entry: entry.request_bytes, records),
        _request_figure("response", "bytes", lambda entry: entry.response_bytes, records),
        _request_figure("latency", "ms", lambda entry: entry.duration_ms, records),
        _request_figure(
            "time to first byte", "ms", lambda entry: entry.first_byte_ms, records, always=False
        ),
        _cell_figure("agent CPU", "agent cgroup", "s", _cpu_seconds, lines),
        _cell_figure("agent peak memory", "agent cgroup", "MiB", _memory_mib, lines),
    )
    return HarnessRequests(
        harness=harness,
        label=label,
        cells=len(lines),
        requests=sum(len(physical_posts(record)) for record in records),
        provider_reported=tuple(_token_figure(field, records) for field in USAGE_SPLIT),
        measured=measured,
        start_up=start_up_figures(lines),
    )


def requests_by_harness(
    lock: Lock, lines: list[LedgerLine], records: Mapping[str, ProxyCellCounts]
) -> tuple[HarnessRequests, ...]:
    """Per harness of the lock, over ``lines`` and the proxy records of their cells."""
    result = []
    for harness in lock.harnesses:
        mine = [line for line in lines if line.harness == harness.id]
        found = [records[line.cell_id] for line in mine if line.cell_id in records]
        result.append(harness_requests(harness.id, harness.label, mine, found))
    return tuple(result)
