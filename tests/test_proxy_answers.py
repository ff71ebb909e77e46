"""The proxy's answer filter: redaction wherever chunk boundaries fall, and decoding."""

from __future__ import annotations

import zlib

import pytest

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
