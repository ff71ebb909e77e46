"""The forms a known secret takes once something has encoded it: what the proxy redacts from an
answer (``forms_pattern``) and the credential scan decodes a kept file's text from
(``decoded_views``), one list of forms for both.

A secret's bytes may reach the guest or a log hex-encoded (either case), percent-encoded or as
JSON ``\\u`` or ``\\x`` escapes (any of its characters, in either case: a URL encoder leaves some
plain), or base64-encoded in either alphabet, padded or not, whole or inside a longer run of
base64. In a longer run the secret begins at one of three alignments; at each, the characters
that encode only the secret's bits are the same whatever surrounds it: those are what the proxy
matches (a secret cut from its run's ends loses a few bits at each end, no more). The scan
knows no bearer in advance, so it decodes instead; it also joins base64 and hex wrapped in
lines and reads hex dumps.
"""

from __future__ import annotations

import base64
import binascii
import re

# Every byte an encoded form can hold besides the secret's own: base64 in either alphabet with
# its padding, hex digits, and the escapes' "%", "\", "u" and "x".
FORM_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_=%\\")


def base64_cores(secret: bytes) -> tuple[bytes, ...]:
    """The standard-alphabet base64 characters that encode only ``secret``'s bits, at each of
    the three alignments it can have inside a longer run (empty for a secret too short)."""
    cores = []
    for align in range(3):
        encoded = base64.b64encode(bytes(align) + secret)
        first = -(-8 * align // 6)  # the first character holding no bit of what came before
        last = 8 * (align + len(secret)) // 6  # past the last character holding only secret bits
        cores.append(encoded[first:last])
    return tuple(core for core in cores if core)


# A standard base64 character as either alphabet has it (the rest are letters and digits).
_EITHER_ALPHABET = {ord("+"): b"[+-]", ord("/"): b"[/_]"}


def _byte_escapes(byte: int) -> bytes:
    """One byte of the secret as itself, a ``%XX`` escape, a JSON ``\\u00XX`` escape or a
    ``\\xXX`` escape."""
    digits = b"(?i:%02x)" % byte
    plain = re.escape(bytes([byte]))
    return b"(?:%b|%%%b|\\\\u00%b|\\\\x%b)" % (plain, digits, digits, digits)


def forms_pattern(secret: bytes) -> bytes:
    """A regular expression (bytes) matching ``secret`` in every form above, itself included."""
    escaped = b"".join(_byte_escapes(byte) for byte in secret)
    hex_form = b"(?i:%b)" % secret.hex().encode()
    cores = [
        b"".join(_EITHER_ALPHABET.get(c, bytes([c])) for c in core) for core in base64_cores(secret)
    ]
    return b"|".join([escaped, hex_form, *cores])


def longest_form(secret: bytes) -> int:
    """The most bytes one form of ``secret`` takes (every byte a ``\\u00XX`` escape)."""
    return 6 * len(secret)


# The scan's side: it knows no bearer in advance (it looks for their shape), so rather than
# match each secret's forms it decodes every stretch of text that could be one of them and
# searches what that gives. A stretch: at least MIN_RUN bytes of base64 (either alphabet, its
# padding), hex, the escapes' "%" and "\" (so JSON's "\n" too), what a URL encoder leaves plain,
# and across a line break after a line of at least WRAPPED_LINE of them (base64 and hex wrapped
# at a width: 76, 64, 60).
MIN_RUN = 16  # base64 of 12 bytes, the shortest secret searched for
WRAPPED_LINE = 40
_URL_PLAIN = frozenset(b".~")  # what a URL encoder leaves plain besides base64's characters
_RUN_MASK = bytes(ord("A") if byte in FORM_BYTES | _URL_PLAIN else 0 for byte in range(256))
_RUN_START = b"A" * MIN_RUN
_URL_SAFE = bytes.maketrans(b"-_", b"+/")
_LINE_BREAKS = re.compile(rb"\\r|\\n")
_NOT_BASE64 = bytes.maketrans(b"%\\.~", b"====")  # what ends a piece of base64: as its padding
_HEX = frozenset(b"0123456789abcdefABCDEF")
_HEX_MASK = bytes(ord("A") if byte in _HEX else 0 for byte in range(256))
_HEX_START = b"A" * 2 * MIN_RUN
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")
_ESCAPE = re.compile(rb"\\(?:u([0-9A-Fa-f]{4})|x([0-9A-Fa-f]{2}))")
# A hex dump's line: an offset (xxd's and hexdump -C's end in 0: 16 bytes a line), then groups
# of hex digits (xxd's of 2 to 16, hexdump -C's and od's of 2), then perhaps the bytes as text.
# Its offset's end and first digits: a literal first, so a window without any is passed fast.
_DUMP_OFFSET = re.compile(rb"0(?:: |  )[0-9a-fA-F]{2}")
_DUMP_LINE = re.compile(
    rb"^[0-9a-fA-F]{5,15}0:? {1,2}((?:[0-9a-fA-F]{2,16} {1,2})*[0-9a-fA-F]{2,16})(?= |\r?$)", re.M
)


def encoded_runs(data: bytes) -> list[bytes]:
    """The stretches of ``data`` that could encode a secret, a wrapped one's lines joined."""
    masked = data.translate(_RUN_MASK)
    runs = []
    at = masked.find(_RUN_START)
    while at >= 0:
        end = _run_end(masked, at)
        lines = [data[at:end]]
        while end - at >= WRAPPED_LINE and (gap := _line_break(data, end)):
            at = end + gap
            end = _run_end(masked, at)
            if end == at:
                break
            lines.append(data[at:end])
        runs.append(b"".join(lines))
        at = masked.find(_RUN_START, end)
    return runs


def _run_end(masked: bytes, at: int) -> int:
    end = masked.find(b"\x00", at)
    return len(masked) if end < 0 else end


def _line_break(data: bytes, at: int) -> int:
    """The length of the line break at ``at`` (0: none)."""
    return 2 if data.startswith(b"\r\n", at) else int(data.startswith(b"\n", at))


def _runs(data: bytes, mask: bytes, start: bytes) -> list[bytes]:
    """The stretches of ``data`` of bytes ``mask`` keeps, ``start`` long or longer; the mask
    turns each byte kept into "A" and any other into NUL, so bytes.find finds the stretches,
    some ten times faster than a regular expression's character class."""
    masked = data.translate(mask)
    runs = []
    at = masked.find(start)
    while at >= 0:
        end = _run_end(masked, at)
        runs.append(data[at:end])
        at = masked.find(start, end)
    return runs


def base64_decodings(run: bytes) -> list[bytes]:
    """A stretch of base64 decoded from each of its first four characters: where the encoded
    text began is not known (a stretch cut by the window's start, a letter before it)."""
    run = run.translate(_URL_SAFE)
    decoded = []
    for start in range(4):
        piece = run[start:]
        piece = piece[: len(piece) - (len(piece) % 4 == 1)]  # a lone character is no byte
        decoded.append(binascii.a2b_base64(piece + b"=" * (-len(piece) % 4)))
    return decoded


def _unescaped(match: re.Match[bytes]) -> bytes:
    code = int(match.group(1) or match.group(2), 16)
    if match.group(2) is not None:
        return bytes([code])
    return chr(code).encode("utf-8", "surrogatepass")


def decoded_views(data: bytes) -> list[tuple[str, bytes]]:
    """What each stretch of ``data`` that could encode a secret decodes to: (the form, its
    bytes). Base64 unwrapped, at each alignment; hex in either case, at each; percent escapes
    and JSON ``\\u``/``\\x`` escapes, among plain characters; a hex dump's lines joined."""
    views: list[tuple[str, bytes]] = []
    for run in encoded_runs(data):
        views += run_views(run)
    dump = b""
    if _DUMP_OFFSET.search(data):
        dump = b"".join(match[1] for match in _DUMP_LINE.finditer(data))
    if len(dump) >= 2 * MIN_RUN:
        views.append(("hex dump", binascii.a2b_hex(_even(dump.replace(b" ", b"")))))
    return views


def run_views(run: bytes) -> list[tuple[str, bytes]]:
    """What one stretch decodes to, in each form."""
    views: list[tuple[str, bytes]] = []
    if b"%" in run:
        views.append(("percent", _PERCENT.sub(lambda m: bytes.fromhex(m[1].decode()), run)))
    if b"\\" in run:
        views.append(("escapes", _ESCAPE.sub(_unescaped, run)))
    unwrapped = _LINE_BREAKS.sub(b"", run) if b"\\" in run else run
    for piece in unwrapped.translate(_NOT_BASE64).split(b"="):
        if len(piece) >= MIN_RUN:
            views += [("base64", decoded) for decoded in base64_decodings(piece)]
        for digits in _runs(piece, _HEX_MASK, _HEX_START) if len(piece) >= 2 * MIN_RUN else ():
            views += [("hex", binascii.a2b_hex(_even(digits[at:]))) for at in (0, 1)]
    return views


def _even(digits: bytes) -> bytes:
    return digits[: len(digits) - len(digits) % 2]
