"""One request's way through the credential proxy (runner.proxy.server): the cell's state it
counts into, its record (``Exchange``, logged once at its end), the headers it forwards and
passes back, its answer written whole or streamed, and the answers of the proxy's own when it is
refused or the provider fails."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
from aiohttp import HttpVersion11, web
from multidict import CIMultiDict

from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.proxy.answers import AnswerFilter
from runner.proxy.models import PathRefusal, RequestLogEntry, RequestOutcome, TokenUsage
from runner.records.prompt import PromptFootprint
from runner.spec.lock import Model

log = logging.getLogger("runner.proxy.server")

# Never forwarded upstream: the client's credentials, hop-by-hop headers, and what aiohttp sets.
REQUEST_HEADERS_DROPPED = frozenset(
    {
        "authorization",
        "x-api-key",
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "accept-encoding",
    }
)
# Never passed back: hop-by-hop headers and framing that aiohttp redoes for the client (the
# answer reaches it decoded, runner.proxy.answers).
RESPONSE_HEADERS_DROPPED = frozenset(
    {
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-encoding",
        "upgrade",
        "trailer",
    }
)


@dataclass
class CellState:
    cell_id: str
    model: Model
    bearer: str
    deadline: float  # epoch seconds
    upstream: str
    key: str
    trust: ssl.SSLContext | bool  # True: the system trust store (aiohttp's default)
    opened_at: datetime
    physical_posts: int = 0
    unsent_posts: int = 0
    rejected_requests: int = 0
    requests: list[Exchange] = field(default_factory=list)
    first_request: PromptFootprint | None = None
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)


@dataclass(slots=True)
class Exchange:
    """What one request did, filled in as it goes and logged once at the end. The cell keeps it
    as it is and builds its log entry, a validated model, when it closes: off the path of the
    request, which validation would lengthen for nothing."""

    started_at: datetime
    started: float  # time.perf_counter()
    method: str
    path: str
    outcome: RequestOutcome = "forwarded"
    status: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    duration_ms: float = 0.0
    usage: dict[str, int] | None = None  # TokenUsage's fields, as the UsageMeter found them
    first_byte_ms: float | None = None
    redactions: int = 0
    refusal: PathRefusal | None = None

    def entry(self, cell_id: str | None) -> RequestLogEntry:
        return RequestLogEntry(
            cell_id=cell_id,
            started_at=self.started_at,
            method=self.method,
            path=self.path,
            outcome=self.outcome,
            status=self.status,
            request_bytes=self.request_bytes,
            response_bytes=self.response_bytes,
            duration_ms=self.duration_ms,
            usage=None if self.usage is None else TokenUsage(**self.usage),
            first_byte_ms=self.first_byte_ms,
            redactions=self.redactions,
            refusal=self.refusal,
        )

    def mark_first_byte(self) -> None:
        self.first_byte_ms = (time.perf_counter() - self.started) * 1000


def refused(request: web.BaseRequest, status: int, message: str) -> web.Response:
    """An answer of the proxy's own. A client that sent ``Expect: 100-continue`` still holds
    the body, which is no longer wanted: the connection ends with the answer."""
    response = web.json_response({"error": {"message": message}}, status=status)
    if request.headers.get("Expect") and not request.content.is_eof():
        response.force_close()
    return response


async def expect_continue(request: web.BaseRequest) -> bool:
    """What aiohttp's router does before a handler (the low-level server does not), here only
    once the request is to be sent on: a client that waits for "100 Continue" before it sends
    the body gets it. False: an expectation the proxy cannot meet (417)."""
    expect = request.headers.get("Expect")
    if expect is None or request.version != HttpVersion11:
        return True
    if expect.lower() != "100-continue":
        return False
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return True


def offered_credential(request: web.BaseRequest) -> tuple[str, str]:
    """(header the client used, value): Anthropic clients send ``x-api-key``, others a bearer."""
    api_key = request.headers.get("x-api-key")
    if api_key is not None:
        return "x-api-key", api_key
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    return "authorization", value.strip() if scheme.lower() == "bearer" else ""


def upstream_headers(request: web.BaseRequest, header: str, key: str) -> dict[str, str]:
    """The client's headers for the provider, its credential replaced by the cell's key."""
    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in REQUEST_HEADERS_DROPPED
    }
    headers[header] = key if header == "x-api-key" else f"Bearer {key}"
    headers["Accept-Encoding"] = "identity"  # usage must be readable as it passes
    return headers


def headers_passed_back(upstream: aiohttp.ClientResponse, answer: AnswerFilter) -> CIMultiDict[str]:
    """The provider's headers for the guest, the key and key-shaped values redacted."""
    return CIMultiDict(
        (name, answer.redactor.text(value))
        for name, value in upstream.headers.items()
        if name.lower() not in RESPONSE_HEADERS_DROPPED
    )


def answered(answer: AnswerFilter, exchange: Exchange) -> None:
    exchange.usage, exchange.redactions = answer.meter.result(), answer.redactions


async def whole_answer(
    upstream: aiohttp.ClientResponse, answer: AnswerFilter, exchange: Exchange
) -> web.Response:
    """A whole JSON answer is of no use to a client in pieces: one write."""
    passed_back = headers_passed_back(upstream, answer)
    payload = answer.feed(await upstream.read()) + answer.finish()
    answered(answer, exchange)
    exchange.response_bytes = len(payload)
    return web.Response(
        body=payload, status=upstream.status, reason=upstream.reason, headers=passed_back
    )


async def stream_answer(
    request: web.BaseRequest,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    answer: AnswerFilter,
    exchange: Exchange,
) -> None:
    """An event stream, passed on chunk by chunk as it arrives, read and redacted on the way."""
    await response.prepare(request)
    async for chunk in upstream.content.iter_any():
        passed = answer.feed(chunk)
        await response.write(passed)
        exchange.response_bytes += len(passed)
    passed = answer.finish()
    await response.write(passed)
    exchange.response_bytes += len(passed)
    answered(answer, exchange)
    await response.write_eof()


def not_sent(
    cell: CellState, exchange: Exchange, error: aiohttp.ClientConnectorError
) -> web.Response:
    """No connection to the provider (refused, DNS, TLS certificate): not a byte of the request
    reached it, so it is no physical POST; the guest gets a 502 that says so."""
    cell.physical_posts -= 1  # counted before the send, so that a cancelled send still counts
    cell.unsent_posts += 1
    exchange.outcome, exchange.status = "not_sent", 502
    log.warning("proxy: cell %s: provider not reached: %s", cell.cell_id, type(error).__name__)
    return web.json_response(
        {"error": {"message": "provider not reached: the request was not sent"}}, status=502
    )


def upstream_failed(
    request: web.BaseRequest,
    cell: CellState,
    exchange: Exchange,
    response: web.StreamResponse,
    error: Exception,
) -> web.StreamResponse:
    """A provider that failed or ran out of the cell's time: a 502, or mid-answer a cut."""
    exchange.outcome = "upstream_failed"
    log.warning("proxy: cell %s: upstream failed: %s", cell.cell_id, type(error).__name__)
    if response.prepared:
        # Mid-answer: the status is gone already; cut the connection so the client sees
        # a broken answer, not a complete one.
        if request.transport is not None:
            request.transport.close()
        return response
    exchange.status = 502
    return web.json_response({"error": {"message": "provider unreachable"}}, status=502)


def upstream_trust(model: Model) -> ssl.SSLContext | bool:
    """What verifies the provider's certificate: the lock's CA bundle (a private CA) if it
    names one, else the system trust store."""
    if model.ca_bundle is None:
        return True
    bundle = REPO_ROOT / model.ca_bundle
    try:
        return ssl.create_default_context(cafile=bundle)
    except (OSError, ssl.SSLError) as error:
        raise RunnerError(
            f"model {model.id}: ca_bundle {bundle} is no readable PEM CA bundle: "
            f"{getattr(error, 'reason', None) or error.strerror or type(error).__name__}"
        ) from None
