"""The proxy's file format: ``<run_dir>/proxy/<cell_id>.json``, one per cell. Never a key."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from runner.core.models import FrozenModel
from runner.records.prompt import PromptFootprint

RequestOutcome = Literal[
    "forwarded",  # sent to the provider; status is the provider's
    "rejected",  # refused here (wrong, expired or previous-cell bearer): 401, never forwarded
    "not_an_api_path",  # right bearer, no POST to an endpoint of the lock's API: 404, not forwarded
    "too_large",  # right bearer and path, a body over the proxy's limit: 413, not forwarded
    "expectation_failed",  # right bearer and path, an Expect other than 100-continue: 417
    "upstream_failed",  # sent, but the answer was dropped, late, or in an unreadable encoding
    "not_sent",  # no connection to the provider (refused, DNS, TLS certificate): 502, not a byte
    "cancelled",  # still running when its cell closed
    "client_gone",  # the harness hung up before the answer was passed back in full
]

# Why a request was "not_an_api_path" (runner.proxy.target): its target's path as written was
# none of the API's endpoint paths, and this is what was in the way.
PathRefusal = Literal[
    "not_post",  # another method
    "not_origin_form",  # an absolute URL (http://host/...), an authority or "*" for a target
    "backslash",  # a backslash in the path, written or percent-encoded (%5c)
    "encoded_slash",  # a "/" inside a segment: %2f, or %252f encoded twice
    "dot_segment",  # "." or "..", written or percent-encoded (%2e%2e)
    "empty_segment",  # "//" or a trailing "/"
    "percent_encoded",  # any other percent-escape in the path (%63hat/completions)
    "unknown_endpoint",  # a plain path, but not one of the API's endpoints
    "malformed_query",  # a query with a "#", a stray "%" or what no query holds
]


class TokenUsage(FrozenModel):
    """One answer's usage split as the provider returned it (``runner.proxy.usage`` says where
    each field comes from per shape); None: the answer did not carry that field, never 0."""

    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    # Optional, so usage recorded before the split existed still loads.
    cache_read_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)


# The fields of TokenUsage, in the order the report shows them (total_tokens is derived).
USAGE_SPLIT: tuple[str, ...] = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


class RequestLogEntry(FrozenModel):
    """One request as the proxy saw it: no header, no body, no query string. ``path`` is the
    request target's path as the guest wrote it, not decoded."""

    cell_id: str | None
    started_at: datetime
    method: str
    path: str
    outcome: RequestOutcome
    status: int
    request_bytes: int = Field(ge=0)
    response_bytes: int = Field(ge=0)
    duration_ms: float = Field(ge=0)
    usage: TokenUsage | None = Field(
        default=None, description="as the provider returned it; None when it returned none"
    )
    # Optional, so request logs written before it existed still load.
    first_byte_ms: float | None = Field(
        default=None,
        ge=0,
        description="from the request's arrival to the provider's status line; None when the "
        "request was not sent on or no answer came",
    )
    redactions: int = Field(
        default=0, ge=0, description="secrets (the key, key-shaped strings) cut from the answer"
    )
    # Optional, so request logs written before it existed still load.
    refusal: PathRefusal | None = Field(
        default=None,
        description="why a 'not_an_api_path' request was refused; None for any other outcome",
    )


class ProxyCellCounts(FrozenModel):
    """What crossed the credential boundary during one cell."""

    schema_version: Literal[1] = 1
    cell_id: str
    model: str = Field(description="the lock's model id")
    provider: str = Field(description="'offline-scripted' for the stand-in provider")
    opened_at: datetime
    closed_at: datetime
    physical_posts: int = Field(ge=0, description="POSTs sent on to the provider")
    # Optional, so proxy records written before it existed still load (those counted such
    # requests as physical POSTs).
    unsent_posts: int = Field(
        default=0,
        ge=0,
        description="POSTs the proxy could not send: no connection to the provider was made "
        "(refused, DNS, TLS certificate), so not a byte of them reached it; the guest got a 502",
    )
    rejected_requests: int = Field(ge=0, description="requests refused with 401")
    provider_posts_received: int | None = Field(
        default=None, ge=0, description="the scripted provider's own count; None for a real one"
    )
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    usage_returned: bool = Field(
        description="every answered POST (2xx) carried usage; tokens are None when none did"
    )
    # Optional, so proxy records written before the usage split existed still load.
    cache_read_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    per_request_accounting: bool = Field(
        default=False,
        description="the request log carries the usage split (cache, reasoning) and the time "
        "to first byte; False in records written before them (there: 'not recorded')",
    )
    requests: tuple[RequestLogEntry, ...] = ()
    first_request: PromptFootprint | None = Field(
        default=None, description="tools and prompt sizes of the cell's first forwarded request"
    )
    # Optional, so proxy records written before it existed still load (as an empty tally).
    upstream_statuses: dict[str, int] = Field(
        default_factory=dict,
        description="how many requests meant for the provider got each status, by code "
        "('502' also for one that could not be sent); cancelled ones are not in it",
    )

    redactions: int = Field(
        default=0,
        ge=0,
        description="the real key and key-shaped strings (sk-...) redacted from the answers, "
        "headers and bodies, before the guest saw them",
    )

    @property
    def provider_answered(self) -> bool:
        """At least one request sent on to the provider got a 2xx answer."""
        return any(code.startswith("2") for code in self.upstream_statuses)


UPSTREAM_OUTCOMES: frozenset[RequestOutcome] = frozenset(
    {"forwarded", "upstream_failed", "client_gone"}
)


def upstream_statuses(entries: tuple[RequestLogEntry, ...]) -> dict[str, int]:
    """The tally of ``ProxyCellCounts.upstream_statuses`` from the request log. A request that
    could not be sent is in it as its 502: a provider that cannot be reached answered the cell
    with nothing but errors (``runner.cells.failure_class``), as one that refused it did."""
    tally: dict[str, int] = {}
    for entry in entries:
        if (entry.outcome in UPSTREAM_OUTCOMES or entry.outcome == "not_sent") and entry.status:
            tally[str(entry.status)] = tally.get(str(entry.status), 0) + 1
    return dict(sorted(tally.items()))


def usage_totals(reported: list[TokenUsage]) -> TokenUsage:
    """Each usage field summed over the answers that carried it; None when none did."""
    totals: dict[str, int | None] = {}
    for name in TokenUsage.model_fields:
        found = [value for usage in reported if (value := getattr(usage, name)) is not None]
        totals[name] = sum(found) if found else None
    return TokenUsage(**totals)
