"""The harness's fixed prompt overhead, read off a request body in any of the three API shapes.

- OpenAI chat completions: ``tools[].function.name``; system text in ``messages`` of role
  ``system`` or ``developer``.
- OpenAI responses: ``tools[].name``; ``instructions``, and ``input`` items of those roles.
- Anthropic messages: ``tools[].name``; ``system`` (a string or text blocks).
"""

from __future__ import annotations

import json
from typing import Any

from runner.records.prompt import PromptFootprint

_SYSTEM_ROLES = frozenset({"system", "developer"})


def prompt_footprint(path: str, body: bytes) -> PromptFootprint | None:
    """None when the body is not a JSON object (the provider will say what is wrong with it)."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    tools = request.get("tools") or []
    tools = tools if isinstance(tools, list) else []
    system = [_text(request.get("system")), _text(request.get("instructions"))]
    for message in [*_items(request.get("messages")), *_items(request.get("input"))]:
        if message.get("role") in _SYSTEM_ROLES:
            system.append(_text(message.get("content")))
    return PromptFootprint(
        api_path=path,
        tool_names=tuple(name for tool in tools if (name := _tool_name(tool))),
        system_prompt_bytes=len("".join(system).encode()),
        tool_definitions_bytes=len(_compact(tools)) if tools else 0,
    )


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def _items(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(content: Any) -> str:
    """A string, or the text of a list of content parts (``{"type": "text", "text": ...}``)."""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in _items(content) if isinstance(part.get("text"), str))


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
