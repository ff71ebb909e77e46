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
import threading
import time
import zlib
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import uvloop
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.provider import PROVIDER_MARKER, ProviderScript, ScriptedProvider
from runner.provider.server import LOOPBACK
from runner.proxy.answers import AnswerFilter, UnreadableEncoding
from runner.proxy.bearer import BEARER_BYTES, new_bearer
from runner.proxy.exchange import (
    CellState,
    Exchange,
    expect_continue,
    headers_passed_back,
    not_sent,
    offered_credential,
    refused,
    stream_answer,
    upstream_failed,
    upstream_headers,
    upstream_trust,
    whole_answer,
)
from runner.proxy.footprint import prompt_footprint
from runner.proxy.models import (
    ProxyCellCounts,
    upstream_statuses,
    usage_totals,
)
from runner.proxy.target import Endpoint, Refused, api_target
from runner.records.paths import RunPaths
from runner.spec.lock import Model

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a long agent context, sent whole with every request
# A guest connection that has not finished a request's head this long after it opened, or after
# its last answer, is closed: a client stalled (or trickling) in its headers holds a connection
# no longer. Longer than a provider's own idle timeout would be of no use to a client's pool.
HEADER_TIMEOUT_SECONDS = 60.0


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
        self._cell: CellState | None = None
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
        trust = upstream_trust(model)
        bearer = new_bearer()
        self._bearers.append(bearer)
        self._keys.add(key)
        self._cell = CellState(
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

    def _counts(self, cell: CellState) -> ProxyCellCounts:
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

    def _admits(self, cell: CellState | None, offered: str) -> bool:
        return (
            cell is not None
            and secrets.compare_digest(offered.encode(), cell.bearer.encode())
            and time.time() < cell.deadline
        )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        cell = self._cell
        exchange = Exchange(
            started_at=datetime.now(UTC),
            started=time.perf_counter(),
            method=request.method,
            path=request.raw_path.partition("?")[0],  # as the guest wrote it
            request_bytes=request.content_length or 0,
        )
        header, offered = offered_credential(request)
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
                return refused(request, 401, "invalid bearer")
            assert cell is not None
            target = (
                api_target(request.raw_path, cell.model.api)
                if request.method == "POST"
                else Refused("not_post", exchange.path)
            )
            if isinstance(target, Refused):
                exchange.outcome, exchange.status = "not_an_api_path", 404
                exchange.refusal = target.why
                return refused(request, 404, "not an API path")
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
        request: web.BaseRequest, exchange: Exchange, sending: bool
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
        return refused(request, 413, f"request body over {MAX_REQUEST_BYTES} bytes")

    async def _forward(
        self,
        request: web.BaseRequest,
        cell: CellState,
        target: Endpoint,
        header: str,
        exchange: Exchange,
    ) -> web.StreamResponse:
        assert self._session is not None
        if (request.content_length or 0) > MAX_REQUEST_BYTES:
            return await self._too_large(request, exchange, not request.headers.get("Expect"))
        if not await expect_continue(request):
            exchange.outcome, exchange.status = "expectation_failed", 417
            return refused(request, 417, "unknown Expect")
        headers = upstream_headers(request, header, cell.key)
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
                    return await whole_answer(upstream, answer, exchange)
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers=headers_passed_back(upstream, answer),
                )
                await stream_answer(request, upstream, response, answer, exchange)
                return response
        except ConnectionResetError:
            exchange.outcome = "client_gone"
            return response
        except aiohttp.ClientConnectorError as error:
            return not_sent(cell, exchange, error)
        except (aiohttp.ClientError, TimeoutError, UnreadableEncoding, zlib.error) as error:
            # An answer the proxy cannot decode is never passed on: what it hides (a key) could
            # not be redacted, nor its usage read.
            return upstream_failed(request, cell, exchange, response, error)

    def _record(self, cell: CellState | None, exchange: Exchange) -> None:
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
