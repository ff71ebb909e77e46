"""Per-request accounting: the usage split of each API shape (whole and streamed) through the
real proxy on loopback, per-cell sums in the ledger line, the agent container's cgroup reading
(the run script's snippet against a fake cgroup dir), and the report's tables, old runs included.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import pytest

from runner.cells.accounting import agent_cgroup_in, request_sums
from runner.core.files import write_model
from runner.core.roots import REPO_ROOT
from runner.guest.agent_plan import CGROUP_ROOT_ENV, CONTAINER, AgentCgroup, then_record_cgroup
from runner.provider import ProviderScript, ToolCall, Turn
from runner.proxy import CredentialProxy, ProxyCellCounts, RequestLogEntry
from runner.records.ledger import Ledger, LedgerLine, RequestSums
from runner.records.paths import RunPaths
from runner.report.stats import spread
from runner.report.write import write_report
from runner.spec.lock import Model
from tests.support.ledger_factory import line_for, new_run_dir

KEY_ENV = "REQUEST_ACCOUNTING_TEST_KEY"
TURN = Turn(text="Run it.", tool_calls=(ToolCall(arguments={"command": "true"}),))
SPLIT = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
FIELDS = (*SPLIT, "reasoning_tokens")


def script(details: bool = True) -> ProviderScript:
    return ProviderScript(name="split", turns=(TURN, TURN), usage_details=details)


MODEL = Model(
    id="scripted",
    provider="scripted",
    model="reference-solution",
    thinking="off",
    api="openai-completions",
    base_url="scripted://local",
    key_env=KEY_ENV,
)


@pytest.fixture
def proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CredentialProxy]:
    monkeypatch.setenv(KEY_ENV, "k" * 32)
    with CredentialProxy(RunPaths(tmp_path / "run")) as running:
        yield running


# api, path, request body, the fields the shape carries (the others must be "not returned")
SHAPES: dict[str, tuple[str, str, dict[str, Any], set[str]]] = {
    "chat": (
        "openai-completions",
        "/chat/completions",
        {"stream_options": {"include_usage": True}},
        {"input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens"},
    ),
    "responses": (
        "openai-responses",
        "/responses",
        {},
        {"input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens"},
    ),
    "anthropic": (
        "anthropic-messages",
        "/v1/messages",
        {},
        {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"},
    ),
}


def body(turn: int, extra: dict[str, Any], stream: bool) -> bytes:
    """A request whose history holds the tool calls of turns before ``turn``."""
    history = " ".join(f"scripted_t{n}_c0" for n in range(turn))
    content = [{"role": "user", "content": f"go {history}"}]
    return json.dumps({"model": "m", "messages": content, "stream": stream, **extra}).encode()


def sent_usage(raw: bytes, turn: int) -> dict[str, int]:
    """What the scripted provider puts in the answer to ``raw`` (its stand-in arithmetic)."""
    inputs = max(1, len(raw) // 4)
    outputs = max(1, len(TURN.model_dump_json()) // 4)
    return {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "cache_read_tokens": inputs // 2 if turn else 0,
        "cache_write_tokens": inputs // 4,
        "reasoning_tokens": outputs // 2,
    }


async def exchange(url: str, raw: bytes, bearer: str) -> bytes:
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=raw, headers=headers) as response,
    ):
        assert response.status == 200
        return await response.read()


def run_cell(
    proxy: CredentialProxy, shape: str, stream: bool, details: bool = True
) -> tuple[ProxyCellCounts, list[tuple[bytes, bytes]]]:
    api, path, extra, _ = SHAPES[shape]
    model = MODEL.model_copy(update={"api": api})  # the proxy sends on its API's paths only
    bearer = proxy.open_cell(
        "cell-1", model, datetime.now(UTC) + timedelta(minutes=5), script(details)
    )
    sent = []
    for turn in (0, 1):
        raw = body(turn, extra, stream)
        sent.append((raw, asyncio.run(exchange(proxy.base_url + path, raw, bearer))))
    return proxy.close_cell("cell-1"), sent


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_request_keeps_the_usage_split_as_sent(
    proxy: CredentialProxy, shape: str, stream: bool
) -> None:
    counts, sent = run_cell(proxy, shape, stream)
    carried = SHAPES[shape][3]
    assert counts.per_request_accounting
    for turn, (entry, (raw, answer)) in enumerate(zip(counts.requests, sent, strict=True)):
        assert entry.usage is not None
        expected = {
            field: value if field in carried else None
            for field, value in sent_usage(raw, turn).items()
        }
        assert {field: getattr(entry.usage, field) for field in FIELDS} == expected
        assert (entry.request_bytes, entry.response_bytes) == (len(raw), len(answer))
        assert entry.first_byte_ms is not None and 0 < entry.first_byte_ms <= entry.duration_ms
    # The first turn reads nothing from the cache: a returned 0, not "not returned".
    assert counts.requests[0].usage is not None and counts.requests[0].usage.cache_read_tokens == 0
    for field in FIELDS:
        values = [getattr(entry.usage, field) for entry in counts.requests]
        assert getattr(counts, field) == (sum(values) if field in carried else None)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_provider_without_cache_fields_is_not_returned_not_zero(
    proxy: CredentialProxy, shape: str
) -> None:
    counts, _ = run_cell(proxy, shape, stream=True, details=False)
    for entry in counts.requests:
        assert entry.usage is not None and entry.usage.input_tokens and entry.usage.output_tokens
        assert (entry.usage.cache_read_tokens, entry.usage.cache_write_tokens) == (None, None)
        assert entry.usage.reasoning_tokens is None
    assert (counts.cache_read_tokens, counts.cache_write_tokens, counts.reasoning_tokens) == (
        None,
        None,
        None,
    )
    sums = request_sums(counts)
    assert sums is not None and sums.cache_read_tokens is None and sums.input_tokens


def test_request_sums_add_up_the_log_and_old_records_have_none(proxy: CredentialProxy) -> None:
    counts, sent = run_cell(proxy, "anthropic", stream=True)
    sums = request_sums(counts)
    assert sums is not None
    assert sums.request_bytes == sum(len(raw) for raw, _ in sent)
    assert sums.response_bytes == sum(len(answer) for _, answer in sent)
    assert sums.latency_ms == pytest.approx(sum(e.duration_ms for e in counts.requests), abs=0.01)
    assert (sums.answers_with_usage, sums.cache_write_tokens) == (2, counts.cache_write_tokens)
    old = ProxyCellCounts.model_validate(old_record_json(counts))
    assert request_sums(old) is None


def old_record_json(counts: ProxyCellCounts) -> dict[str, Any]:
    """``counts`` as a proxy record written before the usage split and first byte existed."""
    record = counts.model_dump(mode="json")
    for name in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
        record.pop(name)
    record.pop("per_request_accounting")
    for entry in record["requests"]:
        entry.pop("first_byte_ms")
        if entry["usage"]:
            entry["usage"] = {
                k: entry["usage"][k] for k in ("input_tokens", "output_tokens", "total_tokens")
            }
    return record


# -- the agent container's cgroup ---------------------------------------------------------------


def run_snippet(tmp_path: Path, cgroup: dict[str, str], command: str) -> tuple[int, Path]:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for name, text in cgroup.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    output = tmp_path / "agent-cgroup.json"
    script = "\n".join(["set -eu", *then_record_cgroup(command, PurePosixPath(output))])
    done = subprocess.run(
        ["bash", "-c", script], env={CGROUP_ROOT_ENV: str(root), "PATH": "/usr/bin:/bin"}
    )
    return done.returncode, output


def test_the_run_script_reads_cgroup_v2_and_keeps_the_harness_exit_code(tmp_path: Path) -> None:
    cgroup = {"cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n", "memory.peak": "7340032\n"}
    code, output = run_snippet(tmp_path, cgroup, "sh -c 'exit 3'")
    assert code == 3
    reading = AgentCgroup.model_validate_json(output.read_text())
    assert (reading.cpu_seconds, reading.memory_peak_bytes) == (2.5, 7340032)
    assert (reading.memory_source, reading.harness_exit_code) == ("memory.peak", 3)


def test_the_run_script_falls_back_to_max_usage_then_to_none(tmp_path: Path) -> None:
    code, output = run_snippet(
        tmp_path / "v1", {"memory/memory.max_usage_in_bytes": "4096\n"}, "true"
    )
    reading = AgentCgroup.model_validate_json(output.read_text())
    assert code == 0 and reading.cpu_usage_usec is None
    assert (reading.memory_peak_bytes, reading.memory_source) == (
        4096,
        "memory/memory.max_usage_in_bytes",
    )
    code, output = run_snippet(tmp_path / "none", {"memory.peak": "garbage"}, "false")
    reading = AgentCgroup.model_validate_json(output.read_text())
    assert code == 1
    assert (reading.cpu_usage_usec, reading.memory_peak_bytes, reading.memory_source) == (
        None,
        None,
        None,
    )


def test_the_cell_runner_takes_the_cgroup_reading_from_the_trial(tmp_path: Path) -> None:
    agent = tmp_path / "trials" / "cell-1" / "agent"
    agent.mkdir(parents=True)
    assert agent_cgroup_in(tmp_path / "trials") is None
    (agent / CONTAINER.agent_cgroup.name).write_text(
        '{"cpu_usage_usec": 1500000, "memory_peak_bytes": 1048576, '
        '"memory_source": "memory.peak", "harness_exit_code": 0}\n'
    )
    reading = agent_cgroup_in(tmp_path / "trials")
    assert reading is not None and reading.cpu_seconds == 1.5
    (agent / CONTAINER.agent_cgroup.name).write_text('{"cpu_usage_usec": ')  # torn
    assert agent_cgroup_in(tmp_path / "trials") is None


def test_spread_has_median_quartiles_and_range() -> None:
    found = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (found.median, found.q1, found.q3, found.low, found.high) == (3, 2, 4, 1, 100)
    assert spread([]).median is None


# -- the report ----------------------------------------------------------------------------------

SEED = REPO_ROOT / "locks" / "seed-54.toml"


def write_run(tmp_path: Path, counts: ProxyCellCounts, new: bool) -> RunPaths:
    """A seed-54 run dir whose every cell has ``counts`` as its proxy record; ``new``: ledger
    lines and records with the per-request fields, else as written before them."""
    paths, schedule = new_run_dir(SEED, tmp_path / "run")
    ledger = Ledger(paths)
    for number, cell in enumerate(schedule.cells):
        record = counts.model_copy(update={"cell_id": cell.id})
        if new:
            write_model(paths.proxy_counts(cell.id), record)
        else:
            path = paths.proxy_counts(cell.id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(old_record_json(record)))
        line = line_for(cell, posts=len(counts.requests), attempts=len(counts.requests))
        if new:
            line = line.model_copy(
                update={
                    "request_sums": request_sums(record),
                    "agent_cpu_seconds": 10.0 + number,
                    "agent_peak_memory_bytes": (100 + number) * 2**20,
                }
            )
        ledger.append(line)
    return paths


def harness_rows(report: str, heading: str) -> list[str]:
    """The rows of the table under the caption that starts with ``heading``."""
    after = report[report.index(heading) :].split("\n\n", 2)[1]
    return [row for row in after.splitlines() if row.startswith("|")]


def test_report_of_an_old_run_says_not_recorded(proxy: CredentialProxy, tmp_path: Path) -> None:
    counts, _ = run_cell(proxy, "chat", stream=False)
    paths = write_run(tmp_path, counts, new=False)
    assert "request_sums" not in paths.ledger.read_text()
    write_report(paths.run_dir)
    report = paths.report_md.read_text()
    provider = harness_rows(report, "**Provider-reported**")
    assert provider[0].split(" | ")[3:] == [
        "input tokens / request",
        "output tokens / request",
        "cache read tokens / request",
        "cache write tokens / request",
        "reasoning tokens / request |",
    ]
    cells = provider[2].split(" | ")
    assert cells[3] != "not recorded" and cells[5:] == ["not recorded"] * 2 + ["not recorded |"]
    measured = harness_rows(report, "**Locally measured**")[2].split(" | ")
    # bytes and latency were in the old log; first byte, CPU and memory were not
    assert "not recorded" not in measured[3:7]
    assert measured[7:] == ["not recorded"] * 2 + ["not recorded |"]


def test_report_shows_requests_tokens_and_agent_cost(
    proxy: CredentialProxy, tmp_path: Path
) -> None:
    counts, sent = run_cell(proxy, "anthropic", stream=True)
    paths = write_run(tmp_path, counts, new=True)
    receipt = write_report(paths.run_dir)
    requests = receipt.batches[0].requests
    assert requests is not None
    first = requests[0]
    tokens = {figure.name: figure for figure in first.provider_reported}
    inputs = [sent_usage(raw, turn)["input_tokens"] for turn, (raw, _) in enumerate(sent)]
    assert tokens["input"].spread.median == sum(inputs) / 2
    assert tokens["reasoning"].recorded == tokens["reasoning"].of > 0
    assert tokens["reasoning"].spread.n == 0  # anthropic sends none: not returned
    cpu = next(figure for figure in first.measured if figure.name == "agent CPU")
    assert (cpu.spread.n, cpu.spread.low) == (first.cells, 10.0)
    report = paths.report_md.read_text()
    row = harness_rows(report, "**Provider-reported**")[2].split(" | ")
    assert row[-1] == "not returned |" and row[-2] != "not returned"
    measured = harness_rows(report, "**Locally measured**")[2]
    assert "not recorded" not in measured and "not returned" not in measured


def test_ledger_lines_leave_out_the_new_fields_when_not_recorded(tmp_path: Path) -> None:
    _, schedule = new_run_dir(SEED, tmp_path / "run")
    line = line_for(schedule.cells[0])
    text = line.model_dump_json(by_alias=True)
    assert "request_sums" not in text and "agent_cpu_seconds" not in text
    sums = RequestSums(answers_with_usage=1, request_bytes=10, response_bytes=20, latency_ms=1.5)
    kept = line.model_copy(update={"request_sums": sums, "agent_cpu_seconds": 0.0})
    again = LedgerLine.model_validate_json(kept.model_dump_json(by_alias=True))
    assert again.request_sums == sums and again.agent_cpu_seconds == 0.0
    assert again.request_sums.cache_read_tokens is None


def test_an_entry_written_before_first_byte_loads() -> None:
    entry = RequestLogEntry.model_validate(
        {
            "cell_id": "c",
            "started_at": "2026-05-29T12:00:00Z",
            "method": "POST",
            "path": "/chat/completions",
            "outcome": "forwarded",
            "status": 200,
            "request_bytes": 1,
            "response_bytes": 2,
            "duration_ms": 3.0,
            "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        }
    )
    assert entry.first_byte_ms is None and entry.usage is not None
    assert entry.usage.cache_read_tokens is None
