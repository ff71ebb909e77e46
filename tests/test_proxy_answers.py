"""The proxy's answer filter: redaction wherever chunk boundaries fall, and decoding."""

from __future__ import annotations

import base64
import itertools
import json
import urllib.parse
import zlib

import pytest

from runner.core.secret_forms import decoded_views
from runner.proxy.answers import REDACTED, AnswerFilter, Redactor, UnreadableEncoding

KEY = "real.provider-key-" + "x" * 24  # a "." too: not every key is of key characters only
SHAPED = "sk-proj-" + "A" * 30
TEXT = (
    f'data: {{"error": "bad key {KEY}, also {SHAPED}, task-{"b" * 24} and \\n{SHAPED}"}}\n\n'
).encode()
EXPECTED = (
    f'data: {{"error": "bad key [REDACTED], also [REDACTED], task-{"b" * 24} and '
    '\\n[REDACTED]"}\n\n'
).encode()


def through(pieces: list[bytes]) -> tuple[bytes, int]:
    redactor = Redactor(KEY)
    out = b"".join(redactor.feed(piece) for piece in pieces) + redactor.finish()
    return out, redactor.redactions


def test_whole_text_is_redacted_and_words_ending_in_sk_are_not() -> None:
    assert through([TEXT]) == (EXPECTED, 3)


def test_every_split_of_the_text_redacts_alike() -> None:
    for cut in range(len(TEXT) + 1):
        assert through([TEXT[:cut], TEXT[cut:]]) == (EXPECTED, 3), cut
    for cut in range(0, len(TEXT), 7):
        assert through([TEXT[i : i + 1] for i in range(cut)] + [TEXT[cut:]]) == (EXPECTED, 3)


def test_nothing_but_possible_secrets_is_held_back() -> None:
    redactor = Redactor(KEY)
    assert redactor.feed(b'data: {"a": 1}\n\n') == b'data: {"a": 1}\n\n'
    assert redactor.feed(b"a word: sk-pro") == b"a word: "  # could become a key
    assert redactor.feed(b"j ends\n") == b"sk-proj ends\n"  # too short to be one
    assert redactor.feed(b"then real.pro") == b"then "  # could become the key
    assert redactor.feed(b"se\n") == b"real.prose\n"
    assert redactor.redactions == 0


def test_header_values_are_redacted_whole() -> None:
    redactor = Redactor(KEY)
    assert redactor.text(f"Bearer {KEY}") == f"Bearer {REDACTED.decode()}"
    assert redactor.redactions == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_answers_are_decoded_before_reading(encoding: str) -> None:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    packer = zlib.compressobj(wbits=wbits)
    packed = packer.compress(TEXT) + packer.flush()
    answer = AnswerFilter(encoding, KEY, event_stream=True)
    out = b"".join(answer.feed(packed[i : i + 5]) for i in range(0, len(packed), 5))
    assert out + answer.finish() == EXPECTED


def test_an_encoding_the_proxy_cannot_read_is_refused() -> None:
    with pytest.raises(UnreadableEncoding):
        AnswerFilter("br", KEY, event_stream=False)


def _base64_in_run(secret: bytes, before: bytes, altchars: bytes, padded: bool) -> bytes:
    """``secret`` base64-encoded after ``before`` (which sets its alignment) and before more
    bytes: the key inside a longer run of base64."""
    encoded = base64.b64encode(before + secret + b"tail", altchars)
    return encoded if padded else encoded.rstrip(b"=")


ENCODINGS: dict[str, bytes] = {
    "hex": KEY.encode().hex().encode(),
    "HEX": KEY.encode().hex().upper().encode(),
    "percent": "".join(f"%{byte:02X}" for byte in KEY.encode()).encode(),
    "percent-lower": "".join(f"%{byte:02x}" for byte in KEY.encode()).encode(),
    "percent-partial": urllib.parse.quote(KEY, safe="").replace("-", "%2D").encode(),
    "json-u": "".join(f"\\u{byte:04x}" for byte in KEY.encode()).encode(),
    "json-U": "".join(f"\\u{byte:04X}" for byte in KEY.encode()).encode(),
    "x-escapes": "".join(f"\\x{byte:02x}" for byte in KEY.encode()).encode(),
    "base64-whole": base64.b64encode(KEY.encode()),
    "base64-whole-unpadded": base64.b64encode(KEY.encode()).rstrip(b"="),
}
for _align in range(3):
    for _alphabet, _altchars in (("std", b"+/"), ("url", b"-_")):
        for _padded in (True, False):
            ENCODINGS[f"base64-{_alphabet}-{_align}-{'padded' if _padded else 'bare'}"] = (
                _base64_in_run(KEY.encode(), b"\xfb\xff"[:_align], _altchars, _padded)
            )


def _leaks_key(out: bytes) -> bool:
    """Whether ``out`` still holds the key in any form: decoded as the credential scan decodes
    kept files (runner.core.secret_forms), so what the proxy lets through the scan would find."""
    views = [out, *(view for _, view in decoded_views(out))]
    return any(KEY[4:-4].encode() in view for view in views)


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_the_keys_encodings_are_redacted_at_every_split(name: str) -> None:
    encoded = ENCODINGS[name]
    assert _leaks_key(encoded), "the check itself must see the key"
    text = b'data: {"echo": "' + encoded + b'"}\n\n'
    for cut in range(0, len(text) + 1, 3):
        out, redactions = through([text[:cut], text[cut:]])
        assert not _leaks_key(out), (name, cut, out)
        assert redactions >= 1
        assert out.endswith(b'"}\n\n')


def test_encoding_look_alikes_pass_untouched() -> None:
    text = b'data: {"a": "' + base64.b64encode(b"x" * 60) + b' %41%42 \\u0041 0123abcdef"}\n\n'
    assert through([text]) == (text, 0)


def _delta(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _streamed_text(out: bytes) -> str:
    events = [event for event in out.split(b"\n\n") if event.startswith(b"data: {")]
    return "".join(
        json.loads(event[6:])["choices"][0]["delta"].get("content", "") for event in events
    )


@pytest.mark.parametrize("cuts", [(10,), (1,), (len(KEY) - 1,), (3, 7, 20, 33)])
def test_a_key_split_across_stream_events_is_redacted(cuts: tuple[int, ...]) -> None:
    said = f"the key is {KEY} indeed"
    bounds = [0, *(len("the key is ") + cut for cut in cuts), len(said)]
    events = [_delta(said[a:b]) for a, b in itertools.pairwise(bounds)] + [b"data: [DONE]\n\n"]
    answer = AnswerFilter(None, KEY, event_stream=True)
    out = b"".join(answer.feed(event) for event in events) + answer.finish()
    assert _streamed_text(out) == "the key is [REDACTED] indeed"
    assert KEY not in out.decode()
    assert out.endswith(b"data: [DONE]\n\n")
    assert answer.redactions == 1


def test_events_that_cannot_begin_the_key_pass_at_once() -> None:
    answer = AnswerFilter(None, KEY, event_stream=True)
    assert answer.feed(_delta("hello ")) == _delta("hello ")
    assert answer.feed(_delta("then real.pro")) == b""  # could go on as the key
    assert answer.feed(_delta("se")) == _delta("then real.pro") + _delta("se")
