"""The three API shapes the harnesses speak, rendered from a scripted turn.

Each shape turns one ``Turn`` into either a JSON body or a list of server-sent events, the way
the real provider would, including usage. Tool call ids carry the turn number
(``scripted_t<turn>_c<n>``): the harness sends them back in its history, which is how the
provider knows which turn comes next, whatever the shape (and a retried request, having the
same history, gets the same turn).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from runner.provider.script import Turn

_TURN_IN_HISTORY = re.compile(rb"scripted_t(\d+)_c\d+")


def next_turn_index(request_body: bytes) -> int:
    """One past the highest turn whose tool call ids appear in the request's history."""
    turns = [int(number) for number in _TURN_IN_HISTORY.findall(request_body)]
    return max(turns) + 1 if turns else 0


@dataclass(frozen=True)
class Reply:
    """What one answer needs besides the turn: ids, model name, token usage."""

    turn: Turn
    turn_index: int
    model: str
    input_tokens: int
    output_tokens: int
    usage_details: bool = True  # False: usage without the cache and reasoning fields

    # Deterministic stand-ins: a later turn reads half its input from the cache (the history
    # repeats), the first reads none (0 returned, not "not returned"); a quarter is written.
    @property
    def cache_read_tokens(self) -> int:
        return self.input_tokens // 2 if self.turn_index else 0

    @property
    def cache_write_tokens(self) -> int:
        return self.input_tokens // 4

    @property
    def reasoning_tokens(self) -> int:
        return self.output_tokens // 2

    def details(self, **fields: dict[str, int] | int) -> dict[str, dict[str, int] | int]:
        """The shape's cache and reasoning fields, or none when the script leaves them out."""
        return fields if self.usage_details else {}

    @property
    def response_id(self) -> str:
        return f"scripted-r{self.turn_index}"

    def call_id(self, n: int) -> str:
        return f"scripted_t{self.turn_index}_c{n}"

    def arguments(self, n: int) -> str:
        return json.dumps(self.turn.tool_calls[n].arguments)

    @property
    def stops(self) -> bool:
        return not self.turn.tool_calls


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class Shape(Protocol):
    path_suffix: str

    def body(self, reply: Reply) -> dict[str, Any]: ...

    def events(self, reply: Reply, request: dict[str, Any]) -> list[bytes]: ...


class ChatCompletions:
    """OpenAI ``/chat/completions``; usage streams only when ``stream_options.include_usage``."""

    path_suffix = "/chat/completions"

    def _usage(self, reply: Reply) -> dict[str, Any]:
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            **reply.details(
                prompt_tokens_details={"cached_tokens": reply.cache_read_tokens},
                completion_tokens_details={"reasoning_tokens": reply.reasoning_tokens},
            ),
        }

    def _finish(self, reply: Reply) -> str:
        return "stop" if reply.stops else "tool_calls"

    def body(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.turn.text or None}
        if reply.turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": reply.call_id(n),
                    "type": "function",
                    "function": {"name": call.tool, "arguments": reply.arguments(n)},
                }
                for n, call in enumerate(reply.turn.tool_calls)
            ]
        return {
            **self._envelope(reply, "chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply)}],
            "usage": self._usage(reply),
        }

    def _envelope(self, reply: Reply, kind: str) -> dict[str, Any]:
        return {"id": reply.response_id, "object": kind, "created": 0, "model": reply.model}

    def _chunk(self, reply: Reply, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse({**self._envelope(reply, "chat.completion.chunk"), "choices": [choice]})

    def events(self, reply: Reply, request: dict[str, Any]) -> list[bytes]:
        events = [self._chunk(reply, {"role": "assistant", "content": reply.turn.text})]
        for n, call in enumerate(reply.turn.tool_calls):
            opening = {
                "index": n,
                "id": reply.call_id(n),
                "type": "function",
                "function": {"name": call.tool, "arguments": ""},
            }
            events.append(self._chunk(reply, {"tool_calls": [opening]}))
            arguments = {"index": n, "function": {"arguments": reply.arguments(n)}}
            events.append(self._chunk(reply, {"tool_calls": [arguments]}))
        events.append(self._chunk(reply, {}, self._finish(reply)))
        if (request.get("stream_options") or {}).get("include_usage"):
            usage = {
                **self._envelope(reply, "chat.completion.chunk"),
                "choices": [],
                "usage": self._usage(reply),
            }
            events.append(sse(usage))
        events.append(sse("[DONE]"))
        return events


class Responses:
    """OpenAI ``/responses``: output items, argument deltas, usage in ``response.completed``."""

    path_suffix = "/responses"

    def _items(self, reply: Reply) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.turn.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{reply.response_id}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {"type": "output_text", "text": reply.turn.text, "annotations": []}
                    ],
                }
            )
        items.extend(
            {
                "type": "function_call",
                "id": f"fc_{reply.call_id(n)}",
                "call_id": reply.call_id(n),
                "name": call.tool,
                "arguments": reply.arguments(n),
                "status": "completed",
            }
            for n, call in enumerate(reply.turn.tool_calls)
        )
        return items

    def body(self, reply: Reply) -> dict[str, Any]:
        return {
            "id": reply.response_id,
            "object": "response",
            "status": "completed",
            "model": reply.model,
            "output": self._items(reply),
            "usage": {
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
                **reply.details(
                    input_tokens_details={"cached_tokens": reply.cache_read_tokens},
                    output_tokens_details={"reasoning_tokens": reply.reasoning_tokens},
                ),
            },
        }

    def events(self, reply: Reply, request: dict[str, Any]) -> list[bytes]:
        final = self.body(reply)
        started = {**final, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str, dict[str, Any]]] = [("response.created", {"response": started})]
        for index, item in enumerate(final["output"]):
            opening = {**item, "status": "in_progress"}
            if item["type"] == "message":
                opening["content"] = []
            else:
                opening["arguments"] = ""
            events.append(("response.output_item.added", {"output_index": index, "item": opening}))
            if item["type"] == "message":
                events.append(
                    (
                        "response.output_text.delta",
                        {
                            "output_index": index,
                            "item_id": item["id"],
                            "content_index": 0,
                            "delta": reply.turn.text,
                        },
                    )
                )
            else:
                delta: dict[str, Any] = {"output_index": index, "item_id": item["id"]}
                events.append(
                    (
                        "response.function_call_arguments.delta",
                        {**delta, "delta": item["arguments"]},
                    )
                )
                events.append(
                    (
                        "response.function_call_arguments.done",
                        {**delta, "arguments": item["arguments"]},
                    )
                )
            events.append(("response.output_item.done", {"output_index": index, "item": item}))
        events.append(("response.completed", {"response": final}))
        return [
            sse({"type": kind, "sequence_number": number, **data}, event=kind)
            for number, (kind, data) in enumerate(events)
        ]


class AnthropicMessages:
    """Anthropic ``/messages``: input tokens in ``message_start``, output in ``message_delta``."""

    path_suffix = "/messages"

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.turn.text:
            blocks.append({"type": "text", "text": reply.turn.text})
        blocks.extend(
            {"type": "tool_use", "id": reply.call_id(n), "name": call.tool, "input": call.arguments}
            for n, call in enumerate(reply.turn.tool_calls)
        )
        return blocks

    def _stop_reason(self, reply: Reply) -> str:
        return "end_turn" if reply.stops else "tool_use"

    def body(self, reply: Reply) -> dict[str, Any]:
        return {
            "id": reply.response_id,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": self._blocks(reply),
            "stop_reason": self._stop_reason(reply),
            "stop_sequence": None,
            "usage": self._usage(reply, reply.output_tokens),
        }

    def _usage(self, reply: Reply, output_tokens: int) -> dict[str, Any]:
        """Anthropic reports no reasoning tokens: thinking is counted in the output."""
        return {
            "input_tokens": reply.input_tokens,
            "output_tokens": output_tokens,
            **reply.details(
                cache_read_input_tokens=reply.cache_read_tokens,
                cache_creation_input_tokens=reply.cache_write_tokens,
            ),
        }

    def events(self, reply: Reply, request: dict[str, Any]) -> list[bytes]:
        started = {
            **self.body(reply),
            "content": [],
            "stop_reason": None,
            "usage": self._usage(reply, 1),
        }
        events: list[dict[str, Any]] = [{"type": "message_start", "message": started}]
        for index, block in enumerate(self._blocks(reply)):
            opening: dict[str, Any]
            delta: dict[str, Any]
            if block["type"] == "text":
                opening = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                opening = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [
                {"type": "content_block_start", "index": index, "content_block": opening},
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_stop", "index": index},
            ]
        events += [
            {
                "type": "message_delta",
                "delta": {"stop_reason": self._stop_reason(reply)},
                "usage": {"output_tokens": reply.output_tokens},
            },
            {"type": "message_stop"},
        ]
        return [sse(event, event=event["type"]) for event in events]


SHAPES: tuple[Shape, ...] = (ChatCompletions(), Responses(), AnthropicMessages())


def shape_for_path(path: str) -> Shape | None:
    return next((shape for shape in SHAPES if path.endswith(shape.path_suffix)), None)
