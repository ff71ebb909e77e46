"""Provider usage read off an answer as it passes through, without holding up a single chunk.

Where usage appears, per shape:
- chat completions: ``usage`` of the JSON body, or of the final stream chunk (when the client
  asked ``stream_options.include_usage``);
- responses: ``usage`` of the body, or ``response.usage`` of the ``response.completed`` event;
- anthropic messages: ``usage`` of the body, or ``message.usage`` of ``message_start`` (input)
  then ``usage`` of ``message_delta`` (output).
A later report of a field replaces an earlier one. No usage seen means "not returned" (None).
Only non-negative integers count as token numbers: anything else the provider sends is ignored.

The split is kept as the provider gives it, each field under the name of ``TokenUsage``:

=================  ==========================================  =================================
field              chat completions / responses                anthropic messages
=================  ==========================================  =================================
input_tokens       prompt_tokens / input_tokens                input_tokens (without the cache)
output_tokens      completion_tokens / output_tokens           output_tokens
cache_read_tokens  prompt_tokens_details.cached_tokens /       cache_read_input_tokens
                   input_tokens_details.cached_tokens
cache_write_tokens (none)                                      cache_creation_input_tokens
reasoning_tokens   completion_tokens_details.reasoning_tokens  (none)
                   / output_tokens_details.reasoning_tokens
=================  ==========================================  =================================

A field the answer does not carry stays out of the result ("not returned"), never 0.
"""

from __future__ import annotations

import json
from typing import Any

# Where each field is in a usage object (a key path), OpenAI chat names first.
_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "input_tokens": (("prompt_tokens",), ("input_tokens",)),
    "output_tokens": (("completion_tokens",), ("output_tokens",)),
    "total_tokens": (("total_tokens",),),
    "cache_read_tokens": (
        ("prompt_tokens_details", "cached_tokens"),
        ("input_tokens_details", "cached_tokens"),
        ("cache_read_input_tokens",),
    ),
    "cache_write_tokens": (("cache_creation_input_tokens",),),
    "reasoning_tokens": (
        ("completion_tokens_details", "reasoning_tokens"),
        ("output_tokens_details", "reasoning_tokens"),
    ),
}


def _count_at(usage: dict[str, Any], path: tuple[str, ...]) -> int | None:
    """The token count at ``path`` in ``usage``; None when absent or not a count."""
    value: Any = usage
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if type(value) is int and value >= 0:  # bool is an int too, but no count
        return value
    return None


def _usage_objects(event: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for holder in (event, event.get("response"), event.get("message")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            found.append(holder["usage"])
    return found


class UsageMeter:
    """Fed the answer's bytes chunk by chunk; ``result`` says what the provider reported, as
    the fields of a ``TokenUsage`` (the proxy builds the model once its cell closes)."""

    def __init__(self, event_stream: bool) -> None:
        self._event_stream = event_stream
        self._pending = b""
        self._fields: dict[str, int] = {}

    def feed(self, chunk: bytes) -> None:
        if not self._event_stream:
            self._pending += chunk
            return
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self._take(line[5:])

    def result(self) -> dict[str, int] | None:
        if self._pending:
            self._take(self._pending.removeprefix(b"data:"))
            self._pending = b""
        if not self._fields:
            return None
        fields = dict(self._fields)
        if "total_tokens" not in fields and {"input_tokens", "output_tokens"} <= fields.keys():
            fields["total_tokens"] = fields["input_tokens"] + fields["output_tokens"]
        return fields

    def _take(self, data: bytes) -> None:
        if b'"usage"' not in data:  # only what mentions usage is worth decoding
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        for usage in _usage_objects(event):
            for field, paths in _FIELDS.items():
                found = (_count_at(usage, path) for path in paths)
                value = next((count for count in found if count is not None), None)
                if value is not None:
                    self._fields[field] = value
