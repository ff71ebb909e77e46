"""Which request targets the proxy sends on: one of the lock API's endpoint paths, appended to
the lock's ``base_url``, and nothing else.

The guest's client has the proxy's origin as its base URL and appends its API's endpoint path
(the OpenAI SDK ``/chat/completions`` or ``/responses``, the Anthropic SDK ``/v1/messages``);
the proxy sends the request on to the lock's ``base_url`` + that path. The path sent on is the
table's constant, never the guest's bytes, and a target is taken only if its path is that
constant exactly as written: no percent-encoding (``%2e%2e``, ``%2f``), dot segment, empty
segment (``//``), backslash or absolute form. What a URL library or the provider's server would
have made of anything else is never asked (``/../../admin/chat/completions`` after a base path
``/v1/s/a`` was ``/v1/admin/chat/completions``). The query string goes on unchanged (Azure's
``api-version``, Anthropic's ``beta=true``): it selects nothing outside the endpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import get_args
from urllib.parse import unquote

from runner.proxy.models import PathRefusal
from runner.spec.lock import Api

# The paths each API's clients append to their base URL (here: the proxy's origin).
API_ENDPOINTS: MappingProxyType[Api, frozenset[str]] = MappingProxyType(
    {
        "openai-completions": frozenset({"/chat/completions"}),
        "openai-responses": frozenset({"/responses"}),
        "anthropic-messages": frozenset({"/v1/messages"}),
    }
)
assert set(API_ENDPOINTS) == set(get_args(Api)), "an API without its endpoint paths"

# RFC 3986's query: unreserved, sub-delims, ":", "@", "/", "?" and percent-escapes. No "#",
# no space, nothing a request line or a URL library would read as something else.
_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What may be sent on: ``path`` (one of ``API_ENDPOINTS[api]``) and the raw ``query``."""

    path: str
    query: str

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass(frozen=True, slots=True)
class Refused:
    """Not sent on (404, ``not_an_api_path``): why, and the target's path as it came."""

    why: PathRefusal
    path: str


def _decoded(path: str) -> str:
    """Percent-decoded until nothing changes (``%252e`` is ``.`` to a server that decodes
    twice), for telling why a path was refused; never for deciding where to send one."""
    for _ in range(4):
        once = unquote(path, errors="surrogateescape")
        if once == path:
            break
        path = once
    return path


def _why_not(path: str, endpoints: frozenset[str]) -> PathRefusal | None:
    if path in endpoints:
        return None
    segments = [_decoded(segment) for segment in path.split("/")[1:]]
    if any("\\" in segment for segment in segments):
        return "backslash"
    if any("/" in segment for segment in segments):
        return "encoded_slash"
    if any(segment in (".", "..") for segment in segments):
        return "dot_segment"
    if "" in segments:
        return "empty_segment"
    if "%" in path:
        return "percent_encoded"
    return "unknown_endpoint"


def api_target(raw_target: str, api: Api) -> Endpoint | Refused:
    """The endpoint a raw request target (the request line's, as the guest wrote it) names
    under the lock's base path, or why it names none."""
    if not raw_target.startswith("/"):  # absolute form (http://host/...), authority form, "*"
        return Refused("not_origin_form", raw_target.partition("?")[0])
    path, _, query = raw_target.partition("?")
    why_not = _why_not(path, API_ENDPOINTS[api])
    if why_not is not None:
        return Refused(why_not, path)
    if not _QUERY.fullmatch(query) or _ESCAPE.sub("", query).count("%"):
        return Refused("malformed_query", path)
    return Endpoint(path, query)
