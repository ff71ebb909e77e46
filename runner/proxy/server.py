"""The credential boundary: a forwarding proxy on 127.0.0.1 that holds the real provider key.

The harness gets a bearer valid for its cell only. The proxy accepts that bearer and nothing
else, swaps it for the real key (read on the host from the lock model's ``key_env``), forwards
the POST to the model's base URL and passes the answer back chunk by chunk. It counts every POST
it sends on (physical POSTs) and every request it refuses, reads provider usage off the answers,
and logs each request without any header, body or query string.

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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import uvloop
from aiohttp import web
from multidict import CIMultiDict

from runner.errors import RunnerError
from runner.files import write_model
from runner.lock import Model
from runner.paths import RunPaths
from runner.provider import PROVIDER_MARKER, ProviderScript, ScriptedProvider
from runner.provider.server import LOOPBACK
from runner.provider.shapes import shape_for_path
from runner.proxy.bearer import BEARER_BYTES, new_bearer
from runner.proxy.models import ProxyCellCounts, RequestLogEntry, RequestOutcome, TokenUsage
from runner.proxy.usage import UsageMeter

log = logging.getLogger(__name__)

T = TypeVar("T")

SCRIPTED_SCHEME = "scripted://"

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
# Never passed back: hop-by-hop headers and framing that aiohttp redoes for the client.
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
    opened_at: datetime
    physical_posts: int = 0
    rejected_requests: int = 0
    requests: list[RequestLogEntry] = field(default_factory=list)
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)


@dataclass
class _Exchange:
    """What one request did, filled in as it goes, logged once at the end."""

    outcome: RequestOutcome = "forwarded"
    status: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    usage: TokenUsage | None = None


def _offered_credential(request: web.Request) -> tuple[str, str]:
    """(header the client used, value): Anthropic clients send ``x-api-key``, others a bearer."""
    api_key = request.headers.get("x-api-key")
    if api_key is not None:
        return "x-api-key", api_key
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    return "authorization", value.strip() if scheme.lower() == "bearer" else ""


class CredentialProxy:
    """Start it, then for each cell: ``open_cell`` -> bearer, run the harness, ``close_cell``."""

    def __init__(self, paths: RunPaths, port: int = 0) -> None:
        self._paths = paths
        self._port = port  # 0: any free loopback port; a lab's proxy port is fixed in lab.json
        self._loop = uvloop.new_event_loop()  # libuv: about half the per-request overhead
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._runner: web.AppRunner | None = None
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
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, port).start()
        return f"http://{LOOPBACK}:{self._runner.addresses[0][1]}"

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
        scripted = model.base_url.startswith(SCRIPTED_SCHEME)
        key = os.environ.get(model.key_env, "")
        if not key and not scripted:
            raise RunnerError(f"environment variable {model.key_env} (key of {model.id}) is unset")
        if scripted:
            if script is None:
                raise RunnerError(f"model {model.id} is scripted: its cells need a script")
            # The stand-in needs some key to check; without one set, a random one serves.
            key = key or secrets.token_urlsafe(BEARER_BYTES)
            upstream = await self._scripted_provider(key, script)
        else:
            upstream = model.base_url.rstrip("/")
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
        answered = [
            entry
            for entry in cell.requests
            if entry.outcome == "forwarded" and 200 <= entry.status < 300
        ]
        reported = [entry.usage for entry in answered if entry.usage is not None]

        def total(name: str) -> int | None:
            values = [value for usage in reported if (value := getattr(usage, name)) is not None]
            return sum(values) if values else None

        scripted = cell.model.base_url.startswith(SCRIPTED_SCHEME)
        return ProxyCellCounts(
            cell_id=cell.cell_id,
            model=cell.model.id,
            provider=PROVIDER_MARKER if scripted else cell.model.provider,
            opened_at=cell.opened_at,
            closed_at=datetime.now(UTC),
            physical_posts=cell.physical_posts,
            rejected_requests=cell.rejected_requests,
            provider_posts_received=(
                self._provider.posts_received if scripted and self._provider else None
            ),
            input_tokens=total("input_tokens"),
            output_tokens=total("output_tokens"),
            total_tokens=total("total_tokens"),
            usage_returned=bool(answered) and len(reported) == len(answered),
            requests=tuple(cell.requests),
        )

    def _admits(self, cell: _Cell | None, offered: str) -> bool:
        return (
            cell is not None
            and secrets.compare_digest(offered.encode(), cell.bearer.encode())
            and time.time() < cell.deadline
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started_at, started = datetime.now(UTC), time.perf_counter()
        cell = self._cell
        header, offered = _offered_credential(request)
        exchange = _Exchange(request_bytes=request.content_length or 0)
        response: web.StreamResponse
        try:
            if not self._admits(cell, offered):
                if cell is None:
                    self.rejected_outside_cells += 1
                else:
                    cell.rejected_requests += 1
                exchange.outcome, exchange.status = "rejected", 401
                return web.json_response({"error": {"message": "invalid bearer"}}, status=401)
            assert cell is not None
            if request.method != "POST" or shape_for_path(request.path) is None:
                exchange.outcome, exchange.status = "not_an_api_path", 404
                return web.json_response({"error": {"message": "not an API path"}}, status=404)
            task = asyncio.current_task()
            assert task is not None
            cell.in_flight.add(task)
            try:
                response = await self._forward(request, cell, header, exchange)
            finally:
                cell.in_flight.discard(task)
            return response
        except asyncio.CancelledError:
            exchange.outcome = "cancelled"
            raise
        finally:
            self._record(cell, request, started_at, started, exchange)

    async def _forward(
        self, request: web.Request, cell: _Cell, header: str, exchange: _Exchange
    ) -> web.StreamResponse:
        assert self._session is not None
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _REQUEST_HEADERS_DROPPED
        }
        headers[header] = cell.key if header == "x-api-key" else f"Bearer {cell.key}"
        headers["Accept-Encoding"] = "identity"  # usage must be readable as it passes
        body = await request.read()
        exchange.request_bytes = len(body)
        timeout = aiohttp.ClientTimeout(total=max(0.001, cell.deadline - time.time()))
        response = web.StreamResponse()
        cell.physical_posts += 1
        try:
            async with self._session.post(
                cell.upstream + request.path_qs, data=body, headers=headers, timeout=timeout
            ) as upstream:
                exchange.status = upstream.status
                passed_back = CIMultiDict(
                    (name, value)
                    for name, value in upstream.headers.items()
                    if name.lower() not in _RESPONSE_HEADERS_DROPPED
                )
                event_stream = "text/event-stream" in upstream.headers.get("Content-Type", "")
                meter = UsageMeter(event_stream)
                if not event_stream:
                    # A whole JSON answer is of no use to a client in pieces: one write.
                    payload = await upstream.read()
                    meter.feed(payload)
                    exchange.usage, exchange.response_bytes = meter.result(), len(payload)
                    return web.Response(
                        body=payload,
                        status=upstream.status,
                        reason=upstream.reason,
                        headers=passed_back,
                    )
                response = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=passed_back
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    meter.feed(chunk)
                    await response.write(chunk)
                    exchange.response_bytes += len(chunk)
                exchange.usage = meter.result()
                await response.write_eof()
                return response
        except ConnectionResetError:
            exchange.outcome = "client_gone"
            return response
        except (aiohttp.ClientError, TimeoutError) as error:
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

    def _record(
        self,
        cell: _Cell | None,
        request: web.Request,
        started_at: datetime,
        started: float,
        exchange: _Exchange,
    ) -> None:
        entry = RequestLogEntry(
            cell_id=cell.cell_id if cell else None,
            started_at=started_at,
            method=request.method,
            path=request.path,
            outcome=exchange.outcome,
            status=exchange.status,
            request_bytes=exchange.request_bytes,
            response_bytes=exchange.response_bytes,
            duration_ms=(time.perf_counter() - started) * 1000,
            usage=exchange.usage,
        )
        if cell is not None:
            cell.requests.append(entry)
        log.info(
            "proxy: %s %s -> %d %s (%d B, %.1f ms) cell=%s",
            entry.method,
            entry.path,
            entry.status,
            entry.outcome,
            entry.response_bytes,
            entry.duration_ms,
            entry.cell_id,
        )
