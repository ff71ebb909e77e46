"""The forms a known secret takes once something has encoded it: what the proxy redacts from an
answer and the credential scan searches a kept file for.

A secret's bytes may reach the guest or a log hex-encoded (either case), percent-encoded or as
JSON ``\\u`` escapes (any of its characters, in either case: a URL encoder leaves some plain), or
base64-encoded in either alphabet, padded or not, whole or inside a longer run of base64. In a
longer run the secret begins at one of three alignments; at each, the characters that encode
only the secret's bits are the same whatever surrounds it: those are searched for (a secret cut
from its run's ends loses a few bits at each end, no more).
"""

from __future__ import annotations

import base64
import re

# Every byte an encoded form can hold besides the secret's own: base64 in either alphabet with
# its padding, hex digits, and the escapes' "%", "\" and "u".
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
    """One byte of the secret as itself, a ``%XX`` escape or a JSON ``\\u00XX`` escape."""
    digits = b"(?i:%02x)" % byte
    plain = re.escape(bytes([byte]))
    return b"(?:%b|%%%b|\\\\u00%b)" % (plain, digits, digits)


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
