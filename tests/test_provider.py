"""The offline scripted provider over real loopback HTTP, in each API shape."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from runner.core.errors import InputError
from runner.provider import Fault, ProviderScript, ScriptedProvider, ToolCall, Turn, script_for
from runner.provider.shapes import next_turn_index

KEY = "provider-key-for-tests-0123456789"
SCRIPT = ProviderScript(
    name="two-calls",
    turns=(Turn(text="first", tool_calls=(ToolCall(arguments={"command": "echo one"}),)),),
    final_text="all done",
)


def run_with_provider(
    script: ProviderScript,
    body: Callable[[ScriptedProvider, aiohttp.ClientSession], Awaitable[Any]],
) -> Any:
    async def main() -> Any:
        provider = ScriptedProvider(KEY, script)
        await provider.start()
        try:
            async with aiohttp.ClientSession() as session:
                return await body(provider, session)
        finally:
            await provider.stop()

    return asyncio.run(main())


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str = KEY
) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url, json=body, headers=headers) as response:
        return response.status, await response.read()


def sse_data(raw: bytes) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in raw.decode().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_chat_stream_plays_the_script_then_stops() -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        url = provider.base_url + "/v1/chat/completions"
        request = {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "go"}],
        }
        status, raw = await post(session, url, request)
        assert status == 200
        chunks = sse_data(raw)
        calls = [
            c
            for chunk in chunks
            for choice in chunk["choices"]
            for c in choice["delta"].get("tool_calls", [])
        ]
        assert calls[0]["id"] == "scripted_t0_c0"
        assert calls[0]["function"]["name"] == "bash"
        assert json.loads(calls[1]["function"]["arguments"]) == {"command": "echo one"}
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
        assert chunks[-1]["usage"]["total_tokens"] > 0
        assert raw.endswith(b"data: [DONE]\n\n")
        # The history now holds the tool call: the provider moves to the final turn.
        request["messages"] += [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "scripted_t0_c0",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "scripted_t0_c0", "content": "one"},
        ]
        status, raw = await post(session, url, request)
        final = sse_data(raw)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in final[:-1]) == (
            "all done"
        )
        assert final[-2]["choices"][0]["finish_reason"] == "stop"
        assert provider.posts_received == 2

    run_with_provider(SCRIPT, body)


def test_without_include_usage_the_stream_carries_no_usage() -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        _, raw = await post(
            session,
            provider.base_url + "/chat/completions",
            {"model": "m", "stream": True, "messages": []},
        )
        assert b'"usage"' not in raw

    run_with_provider(SCRIPT, body)


@pytest.mark.parametrize(
    ("path", "usage_of"),
    [
        ("/chat/completions", lambda b: b["usage"]["prompt_tokens"]),
        ("/responses", lambda b: b["usage"]["input_tokens"]),
        ("/v1/messages", lambda b: b["usage"]["input_tokens"]),
    ],
)
def test_each_shape_answers_json_with_usage(path: str, usage_of: Callable[[Any], int]) -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, provider.base_url + path, {"model": "m"})
        assert status == 200
        assert usage_of(json.loads(raw)) > 0
        assert b"scripted_t0_c0" in raw

    run_with_provider(SCRIPT, body)


def test_responses_stream_ends_with_completed_usage() -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        _, raw = await post(
            session, provider.base_url + "/responses", {"model": "m", "stream": True}
        )
        events = sse_data(raw)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["usage"]["output_tokens"] > 0

    run_with_provider(SCRIPT, body)


def test_anthropic_stream_names_its_events() -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        headers = {"x-api-key": KEY}
        async with session.post(
            provider.base_url + "/v1/messages", json={"model": "m", "stream": True}, headers=headers
        ) as response:
            raw = await response.read()
        names = [line[7:] for line in raw.decode().splitlines() if line.startswith("event: ")]
        assert names[0] == "message_start"
        assert names[-2:] == ["message_delta", "message_stop"]
        assert "tool_use" in raw.decode()

    run_with_provider(SCRIPT, body)


def test_fault_plan_answers_500_then_the_same_turn_again() -> None:
    script = SCRIPT.model_copy(update={"faults": (Fault(post=1, kind="http_error", status=503),)})

    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        url = provider.base_url + "/chat/completions"
        first = await post(session, url, {"model": "m"})
        second = await post(session, url, {"model": "m"})
        assert first[0] == 503
        assert second[0] == 200 and b"scripted_t0_c0" in second[1]
        assert provider.posts_received == 2

    run_with_provider(script, body)


def test_disconnect_fault_cuts_the_stream() -> None:
    script = SCRIPT.model_copy(update={"faults": (Fault(post=1, kind="disconnect"),)})

    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(
                session, provider.base_url + "/chat/completions", {"model": "m", "stream": True}
            )

    run_with_provider(script, body)


def test_stall_fault_holds_the_answer_back() -> None:
    script = SCRIPT.model_copy(update={"faults": (Fault(post=1, kind="stall", seconds=60),)})

    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        url = provider.base_url + "/chat/completions"
        with pytest.raises(TimeoutError):  # a window to see no answer in, far below the stall
            await asyncio.wait_for(post(session, url, {"model": "m"}), timeout=1)
        assert provider.posts_received == 1

    run_with_provider(script, body)


def test_a_wrong_key_is_refused_and_counted() -> None:
    async def body(provider: ScriptedProvider, session: aiohttp.ClientSession) -> None:
        status, _ = await post(session, provider.base_url + "/chat/completions", {}, key="nope")
        assert status == 401
        assert provider.posts_received == 1

    run_with_provider(SCRIPT, body)


def test_turn_index_comes_from_the_history() -> None:
    assert next_turn_index(b'{"messages": []}') == 0
    assert next_turn_index(b'"scripted_t0_c0" ... "scripted_t1_c2"') == 2


def test_reference_solution_script_runs_solve_sh(tmp_path: Path) -> None:
    (tmp_path / "solution").mkdir()
    (tmp_path / "solution" / "solve.sh").write_text("#!/bin/bash\necho solved > /app/answer\n")
    script = script_for("reference-solution", tmp_path)
    command = script.turns[0].tool_calls[0].arguments["command"]
    assert command.endswith("echo solved > /app/answer\n")
    assert script.turn(1).tool_calls == ()


def test_unknown_scripted_model_and_missing_solution_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown"):
        script_for("gpt-9", tmp_path)
    with pytest.raises(InputError, match="no reference solution"):
        script_for("reference-solution", tmp_path)
