"""The proxy reads each API shape's tools and system prompt off a cell's first request."""

from __future__ import annotations

import json

import pytest

from runner.proxy.footprint import prompt_footprint

SYSTEM = "You are a coding agent. é"  # sizes are UTF-8 bytes
TOOL = {"name": "bash", "description": "Run a command", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    ("path", "body", "tools"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "x"},
                ],
                "tools": [{"type": "function", "function": TOOL}],
            },
            [{"type": "function", "function": TOOL}],
        ),
        (
            "/v1/responses",
            {"instructions": SYSTEM, "input": [], "tools": [{"type": "function", **TOOL}]},
            [{"type": "function", **TOOL}],
        ),
        (
            "/v1/messages",
            {"system": [{"type": "text", "text": SYSTEM}], "messages": [], "tools": [TOOL]},
            [TOOL],
        ),
    ],
)
def test_each_shape_gives_tool_names_and_sizes(
    path: str, body: dict[str, object], tools: list[object]
) -> None:
    footprint = prompt_footprint(path, json.dumps(body).encode())
    assert footprint is not None
    assert footprint.tool_names == ("bash",)
    assert footprint.system_prompt_bytes == len(SYSTEM.encode())
    compact = json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode()
    assert footprint.tool_definitions_bytes == len(compact)


def test_a_body_that_is_not_json_gives_none() -> None:
    assert prompt_footprint("/v1/messages", b"\xff not json") is None
