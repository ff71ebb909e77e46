r"""A provider's answer made fit for the guest: decoded if the provider compressed it, and with
the real key and anything shaped like a provider key redacted, chunk by chunk as it streams.

The proxy asks for ``identity``; a provider that compresses anyway (gzip, deflate) is decoded
here, so the usage can be read and the key found. An encoding the proxy cannot read (br, zstd,
a stack of them) is no answer it may pass on: what it hides cannot be redacted.

The real key is redacted in each form an upstream could echo it in (hex, percent and ``\u``
escapes, base64 in either alphabet: ``runner.core.secret_forms``). A secret may be split across
chunks. The redactor holds back only what could still be part of one (the tail of a run of key
characters from its first ``sk-``, or a tail of the bytes the key's forms are made of, no longer
than its longest form), so a stream's event boundaries, never key characters, reach the guest
at once. The key split across the events of a stream is cut by ``runner.proxy.events``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable

from runner.core.secret_forms import FORM_BYTES, forms_pattern, longest_form
from runner.proxy.events import EventJoiner
from runner.proxy.usage import UsageMeter

# What providers' keys look like (OpenAI's sk-..., sk-proj-..., Anthropic's sk-ant-api03-...):
# a key of the provider the guest should not see even if it is not the cell's. Not inside a
# word (task-..., disk-...: the agent's own text), but after a JSON string's "\n".
_KEY_CHARACTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
PROVIDER_KEY_SHAPE = rb"(?:(?<![A-Za-z0-9])|(?<=\\n))sk-[A-Za-z0-9_-]{20,}"
REDACTED = b"[REDACTED]"
_CONTEXT = 2  # bytes before a match its look-behind reads

Decoder = Callable[[bytes], bytes]


class UnreadableEncoding(Exception):
    """The answer's Content-Encoding is none the proxy can decode."""


def _decoder_for(content_encoding: str | None) -> tuple[Decoder, Callable[[], bytes]]:
    """(decode a chunk, flush at the end) for the answer's Content-Encoding: every coding it
    lists, over all its header lines (``identity`` then ``gzip`` is gzip); one coding at most
    besides identity, for a body coded twice is not read."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    applied = [coding for coding in codings if coding not in ("", "identity")]
    if not applied:
        return (lambda chunk: chunk), (lambda: b"")
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
    if len(applied) > 1 or applied[0] not in wbits:
        raise UnreadableEncoding(", ".join(applied))
    inflater = zlib.decompressobj(wbits[applied[0]])
    return inflater.decompress, inflater.flush


class Redactor:
    """Fed the answer's decoded bytes; gives back what may go to the guest now, the real key
    and key-shaped strings replaced by ``[REDACTED]``; ``redactions`` counts them."""

    def __init__(self, key: str) -> None:
        raw = key.encode()
        self._forms = re.compile(forms_pattern(raw))
        self._secret = re.compile(forms_pattern(raw) + b"|" + PROVIDER_KEY_SHAPE)
        self._form_bytes = bytes(sorted(FORM_BYTES | set(raw)))
        self._longest = longest_form(raw)
        self._pending = b""
        self._context = b""  # the last bytes passed on, for the look-behind
        self.redactions = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        end = self._safe_end(data)
        self._pending = data[end:]
        return self._redact(data[:end])

    def finish(self) -> bytes:
        data, self._pending = self._pending, b""
        return self._redact(data)

    def text(self, value: str) -> str:
        """A header's value, redacted whole."""
        raw = value.encode("utf-8", "surrogateescape")
        return self._redact(raw, keep_context=False).decode("utf-8", "surrogateescape")

    def _safe_end(self, data: bytes) -> int:
        """How much of ``data`` no secret can run past: a key-shaped string goes on for as
        long as key characters follow, a form of the real key for its length."""
        run = len(data.rstrip(_KEY_CHARACTERS))
        shaped = data.find(b"sk-", run)
        end = shaped if shaped >= 0 else max(run, len(data) - 2)  # "s", "sk" may begin one
        form_run = len(data.rstrip(self._form_bytes))
        end = min(end, max(form_run, len(data) - self._longest + 1))
        for match in self._forms.finditer(data, max(0, end - self._longest)):
            if match.start() < end < match.end():  # a whole form across the end: keep it so
                return match.start()
        return end

    def _redact(self, data: bytes, keep_context: bool = True) -> bytes:
        context = self._context if keep_context else b""
        text = context + data
        pieces, at = [], len(context)
        for match in self._secret.finditer(text, len(context)):
            pieces += [text[at : match.start()], REDACTED]
            at = match.end()
            self.redactions += 1
        pieces.append(text[at:])
        if keep_context:
            self._context = text[-_CONTEXT:]
        return b"".join(pieces)


class AnswerFilter:
    """One answer on its way to the guest: decoded, its usage read, then redacted (an event
    stream first event by event, for the key split across events, then byte by byte)."""

    def __init__(self, content_encoding: str | None, key: str, event_stream: bool) -> None:
        self._decode, self._flush = _decoder_for(content_encoding)
        self.meter = UsageMeter(event_stream)
        self.redactor = Redactor(key)
        self._events = EventJoiner(key) if event_stream else None

    @property
    def redactions(self) -> int:
        joined = 0 if self._events is None else self._events.redactions
        return self.redactor.redactions + joined

    def feed(self, chunk: bytes) -> bytes:
        plain = self._decode(chunk)
        self.meter.feed(plain)
        if self._events is not None:
            plain = self._events.feed(plain)
        return self.redactor.feed(plain)

    def finish(self) -> bytes:
        plain = self._flush()
        self.meter.feed(plain)
        if self._events is not None:
            plain = self._events.feed(plain) + self._events.finish()
        return self.redactor.feed(plain) + self.redactor.finish()
