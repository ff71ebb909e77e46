"""The real Pi and OMP (npm, on npm's Node and Bun) through the proxy to the scripted provider.

Both are installed once into ``<repo>/.cache/hosttools``
(``python -m runner.artifacts.hosttools LOCK`` does the same for CI), from the npm registry:
``registry`` tests (scripts/test.sh full). They skip only when the npm registry cannot be
reached at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runner.artifacts.hosttools import HostHarness, host_harness
from runner.cells.accounting import count_logical_attempts_in, reconcile
from runner.core.errors import RunnerError
from runner.guest.harness_config import (
    BEARER_ENV,
    Agent,
    agent_command,
    models_config,
    models_file_name,
)
from runner.provider import Fault, ProviderScript, ToolCall, Turn
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.records.paths import RunPaths
from runner.scan.scan import new_canary, scan_run
from runner.spec.lock import Model, load_lock
from tests.support.host_harnesses import HOST_HARNESSES
from tests.support.proxy_fixtures import KEY_ENV, scripted_model

pytestmark = pytest.mark.registry

REPO = Path(__file__).resolve().parent.parent
WRITE_ANSWER = ProviderScript(
    name="write-answer",
    turns=(
        Turn(
            text="Writing the answer.",
            tool_calls=(ToolCall(arguments={"command": "echo 42 > answer.txt && cat answer.txt"}),),
        ),
    ),
    final_text="The answer is in answer.txt.",
)


def _registry_unreachable() -> bool:
    """Only a registry that does not answer excuses a skip; a missing npm is a failure."""
    npm = shutil.which("npm")
    if npm is None:
        return False
    ping = subprocess.run([npm, "ping"], capture_output=True, timeout=60, check=False)
    return ping.returncode != 0


def _installed(agent: Agent) -> HostHarness:
    lock = load_lock(REPO / "locks" / "demo.toml")
    harness = HOST_HARNESSES[agent]
    runtime = lock.tools.runtime_version(harness.runtime)
    try:
        return host_harness(harness, runtime)
    except RunnerError as error:
        if _registry_unreachable():
            pytest.skip(f"the npm registry is unreachable: {error}")
        raise


@pytest.fixture(scope="session")
def pi() -> HostHarness:
    return _installed("pi")


@pytest.fixture(scope="session")
def omp() -> HostHarness:
    return _installed("omp")


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-host-test-" + os.urandom(16).hex()
    monkeypatch.setenv(KEY_ENV, value)
    return value


@pytest.fixture
def proxy(paths: RunPaths, key: str) -> Iterator[CredentialProxy]:
    with CredentialProxy(paths) as running:
        yield running


@dataclass(frozen=True)
class PiRun:
    returncode: int
    trial: Path
    events: Path

    def messages(self) -> list[dict[str, Any]]:
        return [
            event["message"]
            for line in self.events.read_text().splitlines()
            if (event := json.loads(line))["type"] == "message_end"
        ]


def run_agent(
    harness: HostHarness,
    agent: Agent,
    paths: RunPaths,
    cell_id: str,
    model: Model,
    proxy_url: str,
    bearer: str,
    settings: dict[str, Any] | None = None,
) -> PiRun:
    """The agent as a cell runs it: config dir, sessions and event log inside the cell's trial
    dir, the bearer only in its environment, the real key nowhere near it."""
    trial = paths.trial(cell_id)
    agent_dir, work = trial / "agent", trial / "work"
    agent_dir.mkdir(parents=True)
    work.mkdir()
    config = models_config(agent, model, proxy_url)
    (agent_dir / models_file_name(agent)).write_text(json.dumps(config))
    if settings is not None:  # Pi's settings; these tests give none to OMP
        (agent_dir / "settings.json").write_text(json.dumps(settings))
    env = {
        "PATH": harness.path_env,
        "HOME": str(trial),
        "PI_CODING_AGENT_DIR": str(agent_dir),
        "PI_OFFLINE": "1",
        BEARER_ENV: bearer,
    }
    events = trial / "agent-events.jsonl"
    with events.open("w") as stdout, (trial / "agent-stderr.log").open("w") as stderr:
        result = subprocess.run(
            [str(harness.command), *agent_command(model, "Write the answer.")],
            cwd=work,
            env=env,
            stdout=stdout,
            stderr=stderr,
            timeout=180,
            check=False,
        )
    return PiRun(result.returncode, trial, events)


def cell(
    proxy: CredentialProxy,
    paths: RunPaths,
    harness: HostHarness,
    cell_id: str,
    model: Model,
    script: ProviderScript,
    settings: dict[str, Any] | None = None,
    bearer: str | None = None,
    agent: Agent = "pi",
) -> tuple[PiRun, ProxyCellCounts]:
    issued = proxy.open_cell(cell_id, model, datetime.now(UTC) + timedelta(minutes=5), script)
    run = run_agent(
        harness, agent, paths, cell_id, model, proxy.base_url, bearer or issued, settings
    )
    return run, proxy.close_cell(cell_id)


@pytest.mark.parametrize("agent", ["pi", "omp"])
@pytest.mark.parametrize("api", ["openai-completions", "openai-responses", "anthropic-messages"])
def test_agent_completes_a_tool_turn_through_the_proxy(
    request: pytest.FixtureRequest,
    proxy: CredentialProxy,
    paths: RunPaths,
    key: str,
    api: str,
    agent: Agent,
) -> None:
    harness: HostHarness = request.getfixturevalue(agent)
    run, counts = cell(
        proxy, paths, harness, "cell-1", scripted_model(api), WRITE_ANSWER, agent=agent
    )
    assert run.returncode == 0, (run.trial / "agent-stderr.log").read_text()
    assert (run.trial / "work" / "answer.txt").read_text() == "42\n"
    assert [m["stopReason"] for m in run.messages() if m["role"] == "assistant"] == [
        "toolUse",
        "stop",
    ]
    # Physical POSTs at the proxy == POSTs the provider received == Pi's logical attempts.
    events = count_logical_attempts_in(run.events)
    assert counts.physical_posts == counts.provider_posts_received == events.logical_attempts == 2
    result = reconcile(events, counts)
    assert result.reconciled and result.unattributed_provider_post_requests == 0
    assert counts.usage_returned and counts.total_tokens
    assert counts.rejected_requests == 0

    canary = new_canary()
    (run.trial / "canary.txt").write_text(canary)
    secrets = {**proxy.secrets_to_scan(), "canary": (canary,)}
    assert secrets["provider_key"] == (key,)
    report = scan_run(paths, secrets)  # type: ignore[arg-type]
    assert report.clean, report.leaks
    assert report.canary_hits == ("trials/cell-1/canary.txt",)
    assert any(path.suffix == ".jsonl" for path in (run.trial / "agent").rglob("*")), (
        "the agent's own session file is among what was scanned"
    )


def test_pi_sdk_retries_show_as_unattributed_posts(
    pi: HostHarness, proxy: CredentialProxy, paths: RunPaths
) -> None:
    # Provider-level retries happen inside one logical attempt: Pi never sees the 500.
    script = WRITE_ANSWER.model_copy(update={"faults": (Fault(post=1, kind="http_error"),)})
    settings = {"retry": {"provider": {"maxRetries": 2}}}
    run, counts = cell(proxy, paths, pi, "cell-1", scripted_model(), script, settings)
    assert run.returncode == 0
    result = reconcile(count_logical_attempts_in(run.events), counts)
    assert (result.logical_attempts, result.physical_posts) == (2, 3)
    assert result.unattributed_provider_post_requests == 1
    assert counts.provider_posts_received == 3
    assert [request.status for request in counts.requests] == [500, 200, 200]
    assert result.reconciled


def test_pi_agent_retries_are_logical_attempts(
    pi: HostHarness, proxy: CredentialProxy, paths: RunPaths
) -> None:
    # Pi's default: the 500 ends an assistant message with an error, then Pi tries again.
    script = WRITE_ANSWER.model_copy(update={"faults": (Fault(post=1, kind="http_error"),)})
    settings = {"retry": {"baseDelayMs": 50}}
    run, counts = cell(proxy, paths, pi, "cell-1", scripted_model(), script, settings)
    assert run.returncode == 0
    stops = [m["stopReason"] for m in run.messages() if m["role"] == "assistant"]
    assert stops == ["error", "toolUse", "stop"]
    result = reconcile(count_logical_attempts_in(run.events), counts)
    assert (result.logical_attempts, result.physical_posts) == (3, 3)
    assert result.unattributed_provider_post_requests == 0


def test_pi_with_a_previous_cells_bearer_is_refused_and_fails_closed(
    pi: HostHarness, proxy: CredentialProxy, paths: RunPaths
) -> None:
    old = proxy.open_cell(
        "cell-1", scripted_model(), datetime.now(UTC) + timedelta(minutes=5), WRITE_ANSWER
    )
    proxy.close_cell("cell-1")
    run, counts = cell(
        proxy,
        paths,
        pi,
        "cell-2",
        scripted_model(),
        WRITE_ANSWER,
        {"retry": {"enabled": False}},
        bearer=old,
    )
    assert not (run.trial / "work" / "answer.txt").exists()
    assert (counts.rejected_requests, counts.physical_posts) == (1, 0)
    assert counts.provider_posts_received == 0
    result = reconcile(count_logical_attempts_in(run.events), counts)
    assert result.logical_attempts == 1 and not result.reconciled


def test_an_agent_that_prints_its_bearer_is_caught_by_the_scan(
    pi: HostHarness, proxy: CredentialProxy, paths: RunPaths, key: str
) -> None:
    # The bearer is in the harness's environment, so the agent's tools can see it: the scan
    # is what keeps it out of a clean receipt.
    script = ProviderScript(
        name="leaky",
        turns=(Turn(tool_calls=(ToolCall(arguments={"command": f"echo ${BEARER_ENV}"}),)),),
    )
    run, _ = cell(proxy, paths, pi, "cell-1", scripted_model(), script)
    assert run.returncode == 0
    report = scan_run(paths, proxy.secrets_to_scan())  # type: ignore[arg-type]
    assert not report.clean
    assert {leak.kind for leak in report.leaks} == {"bearer"}
    assert "trials/cell-1/agent-events.jsonl" in {leak.file for leak in report.leaks}
    assert key not in paths.scan.read_text()
