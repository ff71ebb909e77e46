"""What a proxy bearer looks like: the proxy issues them, the credential scan looks for them.

Every bearer is ``fbr_`` and 32 random bytes in base64url (256 bits), so it is recognisable on
sight, as GitHub's ``ghp_`` tokens are to secret scanners. The scan flags any string of this
shape, so a bearer issued by an earlier runner process (killed, then resumed by a process that
never knew it) is still caught.
"""

from __future__ import annotations

import re
import secrets

BEARER_PREFIX = "fbr_"
BEARER_BYTES = 32
_BODY = -(-4 * BEARER_BYTES // 3)  # unpadded base64url characters of BEARER_BYTES bytes
BEARER_LENGTH = len(BEARER_PREFIX) + _BODY
_BASE64URL = rb"A-Za-z0-9_-"


# What may split a bearer as it is shown, kept or printed: a line break (a terminal or a log
# wrapping it), JSON's escape of one, a terminal's colour code, raw or escaped.
_SPLIT = rb"(?:\r?\n|\\r\\n|\\n|\x1b\[[0-9;]*[A-Za-z]|\\(?:u001[bB]|x1[bB]|e|033)\[[0-9;]*[A-Za-z])"


# No boundary on either side: a bearer printed at the start of a line sits after "\n" in a JSON
# string or after an ANSI colour code ("...[32m"), both ending in a base64url character, and one
# glued to what follows ("fbr_...Zq", "fbr_..._cell_1") is still a bearer. A longer run of such
# characters after the prefix matches too: reporting a look-alike costs a look, missing a bearer
# costs the key's secrecy.
def shape_in(encoding: str, split: bool = False) -> re.Pattern[bytes]:
    """The bearer shape as text in ``encoding``, one that gives every ASCII character one code
    unit (UTF-8, UTF-16LE/BE, UTF-32LE/BE): a character's bytes are its ASCII byte between
    fixed NULs. ``split``: a line break or a colour code may come before any character of its
    body (UTF-8 only)."""
    before, _, after = "A".encode(encoding).partition(b"A")
    char = re.escape(before) + rb"[%b]" % _BASE64URL + re.escape(after)
    if split:
        char = _SPLIT + b"?" + char
    return re.compile(re.escape(BEARER_PREFIX.encode(encoding)) + rb"(?:%b){%d}" % (char, _BODY))


BEARER_SHAPE = shape_in("utf-8")
SPLIT_BEARER_SHAPE = shape_in("utf-8", split=True)
BEARER_SPLITS = re.compile(_SPLIT)  # taken out of a split match, the bearer it is


def new_bearer() -> str:
    return BEARER_PREFIX + secrets.token_urlsafe(BEARER_BYTES)
