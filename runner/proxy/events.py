"""The real key streamed across events: an upstream that echoes it token by token sends it in
pieces, one per event, which the guest's client joins into the key. No byte filter sees it.

An event stream is cut into whole events. Each event's text pieces (the string values of a
delta's ``content``, ``text``, ``arguments``, ... in its JSON ``data``) are joined across
events in order, as a client joins them. An event whose joined text ends with a beginning of
the key is held back, with every event after it, until the text goes on otherwise (released as
they came) or completes the key: then the key's pieces are cut from the events that carry them,
``[REDACTED]`` put in the first, and those events rewritten. Only events that may still carry a
part of the key wait; every other one passes whole at once, as a client needs it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

REDACTED = "[REDACTED]"
# The fields that carry streamed text in the providers' event shapes (chat completions' delta
# content and tool arguments, responses' delta, Anthropic's text and partial JSON, reasoning).
_TEXT_FIELDS = frozenset(
    {
        "content",
        "text",
        "delta",
        "partial_json",
        "arguments",
        "reasoning",
        "reasoning_content",
        "thinking",
        "refusal",
    }
)
_EVENT_END = re.compile(rb"\r?\n\r?\n|\r\r")
_DATA_LINE = re.compile(rb"^data: ?(.*?)\r?$", re.MULTILINE)


@dataclass
class _Piece:
    """A text piece's place in its event's JSON and its text."""

    holder: dict[str, Any]
    name: str
    text: str


@dataclass
class _Event:
    raw: bytes
    data: Any = None
    span: tuple[int, int] = (0, 0)  # where the JSON is in ``raw``
    pieces: list[_Piece] = field(default_factory=list)
    edited: bool = False

    @classmethod
    def parse(cls, raw: bytes) -> _Event:
        lines = list(_DATA_LINE.finditer(raw))
        if len(lines) != 1 or b'"' not in raw:  # no text, or data split over lines: bytes only
            return cls(raw)
        try:
            data = json.loads(lines[0].group(1))
        except ValueError:
            return cls(raw)
        event = cls(raw, data, lines[0].span(1))
        event._collect(data)
        return event

    def _collect(self, value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                self._collect(item)
        elif isinstance(value, dict):
            for name, item in value.items():
                if name in _TEXT_FIELDS and isinstance(item, str):
                    self.pieces.append(_Piece(value, name, item))
                else:
                    self._collect(item)

    def bytes(self) -> bytes:
        if not self.edited:
            return self.raw
        for piece in self.pieces:
            piece.holder[piece.name] = piece.text
        encoded = json.dumps(self.data, ensure_ascii=False, separators=(",", ":")).encode()
        return self.raw[: self.span[0]] + encoded + self.raw[self.span[1] :]


class EventJoiner:
    """Fed an event stream's decoded bytes; gives back whole events, with the key redacted
    wherever their joined text spells it; ``redactions`` counts the keys so cut."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._buffer = b""
        self._held: list[_Event] = []
        self.redactions = 0

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        released = []
        while (end := _EVENT_END.search(self._buffer)) is not None:
            raw, self._buffer = self._buffer[: end.end()], self._buffer[end.end() :]
            released.append(self._take(_Event.parse(raw)))
        return b"".join(released)

    def finish(self) -> bytes:
        """What is left: held events (no whole key among them) and an unended event."""
        rest, self._buffer = self._buffer, b""
        return self._release(len(self._held)) + rest

    def _take(self, event: _Event) -> bytes:
        self._held.append(event)
        pieces = [piece for held in self._held for piece in held.pieces]
        self._cut_keys(pieces)
        text = "".join(piece.text for piece in pieces)
        waiting = self._key_beginning(text)
        # The events whose text holds that beginning wait, with those after them (in order).
        keep, covered = len(self._held), 0
        while covered < waiting:
            keep -= 1
            covered += sum(len(piece.text) for piece in self._held[keep].pieces)
        return self._release(keep)

    def _key_beginning(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins the key (0: none)."""
        for length in range(min(len(self._key) - 1, len(text)), 0, -1):
            if text.endswith(self._key[:length]):
                return length
        return 0

    def _cut_keys(self, pieces: list[_Piece]) -> None:
        """Cut every whole key from the joined text of ``pieces``, piece by piece."""
        text = "".join(piece.text for piece in pieces)
        starts = [match.start() for match in re.finditer(re.escape(self._key), text)]
        for start in reversed(starts):  # from the end: earlier offsets stay as they were
            self.redactions += 1
            self._cut(pieces, start, start + len(self._key))

    def _cut(self, pieces: list[_Piece], start: int, end: int) -> None:
        offset = 0
        for piece in pieces:
            length = len(piece.text)
            low, high = max(start, offset), min(end, offset + length)
            if low < high:
                mark = REDACTED if low == start else ""
                piece.text = piece.text[: low - offset] + mark + piece.text[high - offset :]
                self._owner(piece).edited = True
            offset += length

    def _owner(self, piece: _Piece) -> _Event:
        return next(event for event in self._held if any(p is piece for p in event.pieces))

    def _release(self, count: int) -> bytes:
        released, self._held = self._held[:count], self._held[count:]
        return b"".join(event.bytes() for event in released)
