"""The credential boundary: a forwarding proxy on 127.0.0.1 that holds the real provider key.

The harness gets a bearer valid for its cell only. The proxy accepts that bearer and nothing
else, swaps it for the real key (read on the host from the lock model's ``key_env``), forwards
the POST to the model's base URL + its API's endpoint path (never elsewhere: no other path,
``runner.proxy.target``; no redirect, no environment proxy) and passes the answer back chunk
by chunk, decoded and with every key redacted (``runner.proxy.answers``).
It counts every POST it sends on (physical POSTs), every one it could not send and every request
it refuses, reads provider usage off the answers, and logs each request without any header, body
or query string.

The server runs on its own event loop in a background thread; the executor calls the blocking
methods (``open_cell``, ``close_cell``) from its own thread. Cell state is only touched on the
proxy's loop, so no lock is needed. Issued bearers and real keys stay in memory: the credential
scan takes them from ``secrets_to_scan`` in-process. Every bearer also has the fixed shape of
``runner.proxy.bearer``, by which the scan finds those an earlier runner process issued.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import ssl
import threading
import time
import zlib
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import uvloop
from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from yarl import URL

from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.core.roots import REPO_ROOT
from runner.provider import PROVIDER_MARKER, ProviderScript, ScriptedProvider
from runner.provider.server import LOOPBACK
from runner.proxy.answers import AnswerFilter, UnreadableEncoding
from runner.proxy.bearer import BEARER_BYTES, new_bearer
from runner.proxy.footprint import prompt_footprint
from runner.proxy.models import (
    PathRefusal,
    ProxyCellCounts,
    RequestLogEntry,
    RequestOutcome,
    TokenUsage,
    upstream_statuses,
    usage_totals,
)
from runner.proxy.target import Endpoint, Refused, api_target
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.spec.lock import Model

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a long agent context, sent whole with every request
# A guest connection that has not finished a request's head this long after it opened, or after
# its last answer, is closed: a client stalled (or trickling) in its headers holds a connection
# no longer. Longer than a provider's own idle timeout would be of no use to a client's pool.
HEADER_TIMEOUT_SECONDS = 60.0

# Never forwarded upstream: the client's credentials, hop-by-hop headers, and what aiohttp sets.
_REQUEST_HEADERS_DROPPED = frozenset(
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
_RESPONSE_HEADERS_DROPPED = frozenset(
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
class _Cell:
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
    requests: list[_Exchange] = field(default_factory=list)
    first_request: PromptFootprint | None = None
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)


@dataclass(slots=True)
class _Exchange:
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


def _refused(request: web.BaseRequest, status: int, message: str) -> web.Response:
    """An answer of the proxy's own. A client that sent ``Expect: 100-continue`` still holds
    the body, which is no longer wanted: the connection ends with the answer."""
    response = web.json_response({"error": {"message": message}}, status=status)
    if request.headers.get("Expect") and not request.content.is_eof():
        response.force_close()
    return response


async def _continue(request: web.BaseRequest) -> bool:
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


def _offered_credential(request: web.BaseRequest) -> tuple[str, str]:
    """(header the client used, value): Anthropic clients send ``x-api-key``, others a bearer."""
    api_key = request.headers.get("x-api-key")
    if api_key is not None:
        return "x-api-key", api_key
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    return "authorization", value.strip() if scheme.lower() == "bearer" else ""


def _upstream_headers(request: web.BaseRequest, header: str, key: str) -> dict[str, str]:
    """The client's headers for the provider, its credential replaced by the cell's key."""
    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in _REQUEST_HEADERS_DROPPED
    }
    headers[header] = key if header == "x-api-key" else f"Bearer {key}"
    headers["Accept-Encoding"] = "identity"  # usage must be readable as it passes
    return headers


def _passed_back(upstream: aiohttp.ClientResponse, answer: AnswerFilter) -> CIMultiDict[str]:
    """The provider's headers for the guest, the key and key-shaped values redacted."""
    return CIMultiDict(
        (name, answer.redactor.text(value))
        for name, value in upstream.headers.items()
        if name.lower() not in _RESPONSE_HEADERS_DROPPED
    )


def _answered(answer: AnswerFilter, exchange: _Exchange) -> None:
    exchange.usage, exchange.redactions = answer.meter.result(), answer.redactions


async def _whole_answer(
    upstream: aiohttp.ClientResponse, answer: AnswerFilter, exchange: _Exchange
) -> web.Response:
    """A whole JSON answer is of no use to a client in pieces: one write."""
    passed_back = _passed_back(upstream, answer)
    payload = answer.feed(await upstream.read()) + answer.finish()
    _answered(answer, exchange)
    exchange.response_bytes = len(payload)
    return web.Response(
        body=payload, status=upstream.status, reason=upstream.reason, headers=passed_back
    )


async def _stream_answer(
    request: web.BaseRequest,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    answer: AnswerFilter,
    exchange: _Exchange,
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
    _answered(answer, exchange)
    await response.write_eof()


def _not_sent(
    cell: _Cell, exchange: _Exchange, error: aiohttp.ClientConnectorError
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


def _upstream_failed(
    request: web.BaseRequest,
    cell: _Cell,
    exchange: _Exchange,
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


def _upstream_trust(model: Model) -> ssl.SSLContext | bool:
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


class CredentialProxy:
    """Start it, then for each cell: ``open_cell`` -> bearer, run the harness, ``close_cell``."""

    def __init__(
        self,
        paths: RunPaths,
        port: int = 0,
        keys: Mapping[str, str] | None = None,
        header_timeout: float = HEADER_TIMEOUT_SECONDS,
    ) -> None:
        self._paths = paths
        self._port = port  # 0: any free loopback port; a lab's proxy port is fixed in lab.json
        self._header_timeout = header_timeout
        # The real keys by variable name; None: read from this process's environment per cell.
        self._key_source: Mapping[str, str] = os.environ if keys is None else keys
        self._loop = uvloop.new_event_loop()  # libuv: about half the per-request overhead
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._provider: ScriptedProvider | None = None
        self._cell: _Cell | None = None
        self._bearers: list[str] = []
        self._keys: set[str] = set()
        self.rejected_outside_cells = 0
        self.base_url = ""

    # -- blocking API for the executor -------------------------------------------------------

    def start(self, port: int | None = None) -> str:
        self._thread.start()
        self.base_url = self._call(self._start(self._port if port is None else port))
        return self.base_url

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> CredentialProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_cell(
        self,
        cell_id: str,
        model: Model,
        deadline: datetime,
        script: ProviderScript | None = None,
    ) -> str:
        """A fresh bearer, valid for this cell until ``deadline`` or ``close_cell``."""
        return self._call(self._open_cell(cell_id, model, deadline, script))

    def close_cell(self, cell_id: str) -> ProxyCellCounts:
        """End the cell's bearer, cancel what is still in flight, write and return the counts."""
        counts = self._call(self._close_cell(cell_id))
        write_model(self._paths.proxy_counts(cell_id), counts)
        return counts

    def secrets_to_scan(self) -> dict[str, tuple[str, ...]]:
        """Every real key used and every bearer issued by this proxy, for the credential scan."""
        return {"provider_key": tuple(sorted(self._keys)), "bearer": tuple(self._bearers)}

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # -- on the proxy's loop -----------------------------------------------------------------

    async def _start(self, port: int) -> str:
        # The one place a request leaves the proxy. Never the environment's HTTP(S)_PROXY or
        # .netrc (trust_env): through a proxy variable the request, and over plain http the key,
        # would go to an origin the lock does not name.
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None), trust_env=False
        )
        # aiohttp's low-level server: _handle answers every method and path itself, so an
        # Application's router and middleware chain would only cost time (a tenth of the
        # proxy's CPU per request).
        # aiohttp's keep-alive timer runs from a connection's opening and from each answer, and
        # closes the connection only while it waits for a request's head: the header timeout.
        server = web.Server(
            self._handle,
            request_factory=self._request,
            access_log=None,
            keepalive_timeout=self._header_timeout,
        )
        self._runner = web.ServerRunner(server)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, port).start()
        return f"http://{LOOPBACK}:{self._runner.addresses[0][1]}"

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        return web.BaseRequest(
            message, payload, protocol, writer, task, self._loop, client_max_size=MAX_REQUEST_BYTES
        )

    async def _stop(self) -> None:
        if self._cell is not None:
            await self._close_cell(self._cell.cell_id)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self._provider is not None:
            await self._provider.stop()

    async def _open_cell(
        self, cell_id: str, model: Model, deadline: datetime, script: ProviderScript | None
    ) -> str:
        if self._cell is not None:
            raise RunnerError(f"proxy: cell {self._cell.cell_id} is still open")
        if deadline.tzinfo is None:
            raise RunnerError("proxy: a cell deadline needs a time zone")
        scripted = model.is_scripted
        key = self._key_source.get(model.key_env, "")
        if not key and not scripted:
            raise RunnerError(f"environment variable {model.key_env} (key of {model.id}) is unset")
        if scripted:
            if script is None:
                raise RunnerError(f"model {model.id} is scripted: its cells need a script")
            # The stand-in needs some key to check; without one set, a random one serves.
            key = key or secrets.token_urlsafe(BEARER_BYTES)
            upstream = await self._scripted_provider(key, script)
        else:
            upstream = str(URL(model.base_url.rstrip("/")))  # its escapes as aiohttp sends them
        trust = _upstream_trust(model)
        bearer = new_bearer()
        self._bearers.append(bearer)
        self._keys.add(key)
        self._cell = _Cell(
            cell_id=cell_id,
            model=model,
            bearer=bearer,
            deadline=deadline.timestamp(),
            upstream=upstream,
            key=key,
            trust=trust,
            opened_at=datetime.now(UTC),
        )
        return bearer

    async def _scripted_provider(self, key: str, script: ProviderScript) -> str:
        if self._provider is None or not secrets.compare_digest(
            self._provider.api_key.encode(), key.encode()
        ):
            if self._provider is not None:
                await self._provider.stop()
            self._provider = ScriptedProvider(key)
            await self._provider.start()
        self._provider.load_script(script)
        return self._provider.base_url

    async def _close_cell(self, cell_id: str) -> ProxyCellCounts:
        cell = self._cell
        if cell is None or cell.cell_id != cell_id:
            raise RunnerError(f"proxy: cell {cell_id} is not the open cell")
        self._cell = None
        for task in list(cell.in_flight):
            task.cancel()
        await asyncio.gather(*cell.in_flight, return_exceptions=True)
        return self._counts(cell)

    def _counts(self, cell: _Cell) -> ProxyCellCounts:
        entries = tuple(exchange.entry(cell.cell_id) for exchange in cell.requests)
        answered = [
            entry for entry in entries if entry.outcome == "forwarded" and 200 <= entry.status < 300
        ]
        reported = [entry.usage for entry in answered if entry.usage is not None]
        redactions = sum(entry.redactions for entry in entries)
        scripted = cell.model.is_scripted
        return ProxyCellCounts(
            cell_id=cell.cell_id,
            model=cell.model.id,
            provider=PROVIDER_MARKER if scripted else cell.model.provider,
            opened_at=cell.opened_at,
            closed_at=datetime.now(UTC),
            physical_posts=cell.physical_posts,
            unsent_posts=cell.unsent_posts,
            rejected_requests=cell.rejected_requests,
            provider_posts_received=(
                self._provider.posts_received if scripted and self._provider else None
            ),
            **usage_totals(reported).model_dump(),
            per_request_accounting=True,
            usage_returned=bool(answered) and len(reported) == len(answered),
            requests=entries,
            upstream_statuses=upstream_statuses(entries),
            first_request=cell.first_request,
            redactions=redactions,
        )

    def _admits(self, cell: _Cell | None, offered: str) -> bool:
        return (
            cell is not None
            and secrets.compare_digest(offered.encode(), cell.bearer.encode())
            and time.time() < cell.deadline
        )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        cell = self._cell
        exchange = _Exchange(
            started_at=datetime.now(UTC),
            started=time.perf_counter(),
            method=request.method,
            path=request.raw_path.partition("?")[0],  # as the guest wrote it
            request_bytes=request.content_length or 0,
        )
        header, offered = _offered_credential(request)
        response: web.StreamResponse
        try:
            # Nothing is answered to a request without the cell's bearer but its 401: no
            # "100 Continue" (the body is never wanted), no word on its path.
            if not self._admits(cell, offered):
                if cell is None:
                    self.rejected_outside_cells += 1
                else:
                    cell.rejected_requests += 1
                exchange.outcome, exchange.status = "rejected", 401
                return _refused(request, 401, "invalid bearer")
            assert cell is not None
            target = (
                api_target(request.raw_path, cell.model.api)
                if request.method == "POST"
                else Refused("not_post", exchange.path)
            )
            if isinstance(target, Refused):
                exchange.outcome, exchange.status = "not_an_api_path", 404
                exchange.refusal = target.why
                return _refused(request, 404, "not an API path")
            task = asyncio.current_task()
            assert task is not None
            cell.in_flight.add(task)
            try:
                response = await self._forward(request, cell, target, header, exchange)
            finally:
                cell.in_flight.discard(task)
            return response
        except asyncio.CancelledError:
            exchange.outcome = "cancelled"
            raise
        finally:
            self._record(cell, exchange)

    @staticmethod
    async def _too_large(
        request: web.BaseRequest, exchange: _Exchange, sending: bool
    ) -> web.Response:
        """A body over the limit, by its Content-Length before it is read (and before a "100
        Continue"), or as it is read: never sent on. A client ``sending`` its body has the
        rest read and dropped before the answer, which it then reads whole (answered while it
        still sends, it may see only a reset); one that waits for "100 Continue" sends none."""
        exchange.outcome, exchange.status = "too_large", 413
        log.warning("proxy: a request body over %d bytes refused", MAX_REQUEST_BYTES)
        if sending:
            while await request.content.readany():
                pass
        return _refused(request, 413, f"request body over {MAX_REQUEST_BYTES} bytes")

    async def _forward(
        self,
        request: web.BaseRequest,
        cell: _Cell,
        target: Endpoint,
        header: str,
        exchange: _Exchange,
    ) -> web.StreamResponse:
        assert self._session is not None
        if (request.content_length or 0) > MAX_REQUEST_BYTES:
            return await self._too_large(request, exchange, not request.headers.get("Expect"))
        if not await _continue(request):
            exchange.outcome, exchange.status = "expectation_failed", 417
            return _refused(request, 417, "unknown Expect")
        headers = _upstream_headers(request, header, cell.key)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # a body without a Content-Length
            return await self._too_large(request, exchange, sending=True)
        exchange.request_bytes = len(body)
        if cell.physical_posts == 0:
            cell.first_request = prompt_footprint(target.path, body)
        timeout = aiohttp.ClientTimeout(total=max(0.001, cell.deadline - time.time()))
        response = web.StreamResponse()
        cell.physical_posts += 1
        try:
            # To the lock's base URL + the endpoint's path from the table + the query as the
            # guest wrote it (runner.proxy.target), encoded: nothing is tidied on the way.
            # Never follow a redirect: following one sends the request (and, to another origin,
            # perhaps the key) where the lock did not say, as a POST the count would not see. The
            # guest gets the answer as the provider gave it, and it is recorded so.
            async with self._session.post(
                URL(cell.upstream + target.path_qs, encoded=True),
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                ssl=cell.trust,
            ) as upstream:
                exchange.mark_first_byte()
                exchange.status = upstream.status
                event_stream = "text/event-stream" in upstream.headers.get("Content-Type", "")
                answer = AnswerFilter(
                    ", ".join(upstream.headers.getall("Content-Encoding", ())),
                    cell.key,
                    event_stream,
                )
                if not event_stream:
                    return await _whole_answer(upstream, answer, exchange)
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=_passed_back(upstream, answer),
                )
                await _stream_answer(request, upstream, response, answer, exchange)
                return response
        except ConnectionResetError:
            exchange.outcome = "client_gone"
            return response
        except aiohttp.ClientConnectorError as error:
            return _not_sent(cell, exchange, error)
        except (aiohttp.ClientError, TimeoutError, UnreadableEncoding, zlib.error) as error:
            # An answer the proxy cannot decode is never passed on: what it hides (a key) could
            # not be redacted, nor its usage read.
            return _upstream_failed(request, cell, exchange, response, error)

    def _record(self, cell: _Cell | None, exchange: _Exchange) -> None:
        exchange.duration_ms = (time.perf_counter() - exchange.started) * 1000
        if cell is not None:
            cell.requests.append(exchange)
        log.info(
            "proxy: %s %s -> %d %s (%d B, %.1f ms) cell=%s",
            exchange.method,
            exchange.path,
            exchange.status,
            exchange.outcome,
            exchange.response_bytes,
            exchange.duration_ms,
            cell.cell_id if cell else None,
        )
