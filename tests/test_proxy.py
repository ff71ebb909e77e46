"""The credential proxy over real loopback HTTP: bearers, key swap, streaming, counts, log."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.provider import Fault, ProviderScript, ToolCall, Turn
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.proxy.bearer import BEARER_PREFIX, BEARER_SHAPE, new_bearer
from runner.records.paths import RunPaths
from runner.scan.scan import scan_run
from tests.support.proxy_fixtures import CHAT, KEY, KEY_ENV, scripted_model, soon, upstream_model
from tests.support.tls import LoopbackCA, make_ca

SCRIPT = ProviderScript(
    name="one-call",
    turns=(Turn(tool_calls=(ToolCall(arguments={"command": "true"}),)),),
)


@pytest.fixture
def ca(tmp_path: Path) -> LoopbackCA:
    return make_ca(tmp_path / "ca")


async def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        return response.status, await response.read()


def bearer_post(
    proxy: CredentialProxy,
    bearer: str,
    path: str = "/chat/completions",
    body: dict[str, Any] = CHAT,
) -> tuple[int, bytes]:
    return asyncio.run(post(proxy.base_url + path, body, {"Authorization": f"Bearer {bearer}"}))


def test_the_cell_bearer_is_swapped_for_the_key_and_counted(
    proxy: CredentialProxy, paths: RunPaths
) -> None:
    bearer = proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    # The provider accepts only the real key: a 200 proves the proxy swapped the bearer.
    status, body = bearer_post(
        proxy, bearer, body={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and b"scripted_t0_c0" in body
    counts = proxy.close_cell("cell-1")
    assert counts.physical_posts == 1 == counts.provider_posts_received
    assert counts.provider == "offline-scripted"
    assert counts.usage_returned and counts.input_tokens and counts.output_tokens
    assert counts.total_tokens == counts.input_tokens + counts.output_tokens
    assert read_model(paths.proxy_counts("cell-1"), ProxyCellCounts) == counts
    text = paths.proxy_counts("cell-1").read_text()
    assert KEY not in text and bearer not in text


def test_anthropic_clients_authenticate_with_x_api_key(proxy: CredentialProxy) -> None:
    bearer = proxy.open_cell("cell-1", scripted_model("anthropic-messages"), soon(), SCRIPT)
    status, body = asyncio.run(
        post(proxy.base_url + "/v1/messages", {"model": "m"}, {"x-api-key": bearer})
    )
    assert status == 200 and b"tool_use" in body
    assert proxy.close_cell("cell-1").physical_posts == 1


@pytest.mark.parametrize("offered", ["", "Bearer ", "Bearer wrong-bearer", "Basic abc"])
def test_anything_but_the_cell_bearer_is_refused(proxy: CredentialProxy, offered: str) -> None:
    proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    headers = {"Authorization": offered} if offered else {}
    status, _ = asyncio.run(post(proxy.base_url + "/chat/completions", CHAT, headers))
    assert status == 401
    counts = proxy.close_cell("cell-1")
    assert (counts.rejected_requests, counts.physical_posts) == (1, 0)
    assert counts.provider_posts_received == 0
    assert counts.requests[0].outcome == "rejected"


def test_a_previous_cells_bearer_is_refused_in_the_next_cell(proxy: CredentialProxy) -> None:
    old = proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    proxy.close_cell("cell-1")
    assert bearer_post(proxy, old)[0] == 401  # between cells
    new = proxy.open_cell("cell-2", scripted_model(), soon(), SCRIPT)
    assert new != old
    assert bearer_post(proxy, old)[0] == 401
    assert bearer_post(proxy, new)[0] == 200
    counts = proxy.close_cell("cell-2")
    assert (counts.rejected_requests, counts.physical_posts) == (1, 1)
    assert proxy.rejected_outside_cells == 1
    assert proxy.secrets_to_scan()["bearer"] == (old, new)


def test_an_expired_bearer_is_refused(proxy: CredentialProxy) -> None:
    deadline = soon(1)
    bearer = proxy.open_cell("cell-1", scripted_model(), deadline, SCRIPT)
    assert bearer_post(proxy, bearer)[0] == 200
    while time.time() < deadline.timestamp():  # until the deadline has passed, no longer
        time.sleep(deadline.timestamp() - time.time())
    assert bearer_post(proxy, bearer)[0] == 401
    counts = proxy.close_cell("cell-1")
    assert (counts.physical_posts, counts.rejected_requests) == (1, 1)


def test_bearers_are_random_and_of_the_shape_the_scan_knows(proxy: CredentialProxy) -> None:
    bearers = set()
    for n in range(5):
        bearers.add(proxy.open_cell(f"cell-{n}", scripted_model(), soon(), SCRIPT))
        proxy.close_cell(f"cell-{n}")
    assert len(bearers) == 5
    for bearer in bearers:
        assert bearer.startswith(BEARER_PREFIX) and BEARER_SHAPE.fullmatch(bearer.encode())
        assert len(bearer) >= len(BEARER_PREFIX) + 43  # 32 random bytes, base64url


def test_a_resumed_runner_scan_catches_a_bearer_an_earlier_proxy_issued(
    proxy: CredentialProxy, paths: RunPaths
) -> None:
    earlier = proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    proxy.close_cell("cell-1")
    paths.trial("cell-1").mkdir(parents=True)
    (paths.trial("cell-1") / "agent.log").write_text(f"$ env\nBENCH_PROXY_BEARER={earlier}\n")
    # After a kill -9 the resumed process has a new proxy that never saw ``earlier``.
    with CredentialProxy(paths) as resumed:
        assert earlier not in resumed.secrets_to_scan()["bearer"]
        report = scan_run(paths, resumed.secrets_to_scan())  # type: ignore[arg-type]
    assert [(leak.file, leak.kind) for leak in report.leaks] == [
        ("trials/cell-1/agent.log", "bearer")
    ]


def test_what_the_proxy_writes_holds_no_bearer(proxy: CredentialProxy, paths: RunPaths) -> None:
    bearer = proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    assert bearer_post(proxy, bearer)[0] == 200
    assert bearer_post(proxy, new_bearer())[0] == 401  # an impostor's, refused and logged
    proxy.close_cell("cell-1")
    report = scan_run(paths, {})  # no bearer handed over: only the shape is looked for
    assert report.files_scanned == 1 and report.clean, report.leaks


def test_non_api_paths_are_not_forwarded(proxy: CredentialProxy) -> None:
    bearer = proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    assert bearer_post(proxy, bearer, path="/models")[0] == 404
    counts = proxy.close_cell("cell-1")
    assert counts.physical_posts == 0 == counts.provider_posts_received
    assert counts.requests[0].outcome == "not_an_api_path"


def test_provider_errors_pass_through_and_count(proxy: CredentialProxy) -> None:
    script = SCRIPT.model_copy(update={"faults": (Fault(post=1, kind="http_error", status=500),)})
    bearer = proxy.open_cell("cell-1", scripted_model(), soon(), script)
    assert bearer_post(proxy, bearer)[0] == 500
    assert bearer_post(proxy, bearer)[0] == 200
    counts = proxy.close_cell("cell-1")
    assert counts.physical_posts == 2 == counts.provider_posts_received
    assert [r.status for r in counts.requests] == [500, 200]
    assert counts.usage_returned  # the 500 is not an answer that owes usage


def test_close_cancels_a_stalled_request(proxy: CredentialProxy, paths: RunPaths) -> None:
    arrived, released = asyncio.Event(), asyncio.Event()

    async def stalled(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await released.wait()  # the stall: no answer until the test is done
        return web.json_response({})

    async def close_while_stalled(base_url: str) -> None:
        model = upstream_model(base_url)
        bearer = await asyncio.to_thread(proxy.open_cell, "cell-1", model, soon())
        request = asyncio.create_task(
            post(proxy.base_url + "/chat/completions", CHAT, {"Authorization": f"Bearer {bearer}"})
        )
        await asyncio.wait_for(arrived.wait(), timeout=10)
        await asyncio.to_thread(proxy.close_cell, "cell-1")
        with pytest.raises(aiohttp.ClientError):
            await request
        released.set()

    with_upstream(stalled, close_while_stalled)
    counts = read_model(paths.proxy_counts("cell-1"), ProxyCellCounts)
    assert counts.physical_posts == 1
    assert counts.requests[0].outcome == "cancelled"


def test_a_refused_connection_is_a_502_and_no_physical_post(
    proxy: CredentialProxy, ca: LoopbackCA
) -> None:
    """Not a byte reached the provider: the POST is "not sent", apart from the physical ones."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = upstream_model(f"https://127.0.0.1:{port}/v1", ca.bundle)
    bearer = proxy.open_cell("cell-1", model, soon())
    status, body = bearer_post(proxy, bearer)
    assert status == 502 and b"not sent" in body
    counts = proxy.close_cell("cell-1")
    assert (counts.physical_posts, counts.unsent_posts) == (0, 1)
    assert counts.requests[0].outcome == "not_sent"
    assert counts.upstream_statuses == {"502": 1}  # the provider answered nothing but errors
    assert counts.provider_posts_received is None and counts.provider == "test"


def with_upstream(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    body: Callable[[str], Awaitable[None]],
    tls: LoopbackCA | None = None,
) -> None:
    """Run ``body(upstream base URL)`` while a test upstream server answers with ``handler``:
    over HTTPS with a certificate of ``tls``'s CA if given."""

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        ssl_context = None if tls is None else tls.server
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        scheme = "http" if tls is None else "https"
        try:
            await body(f"{scheme}://127.0.0.1:{runner.addresses[0][1]}/v1")
        finally:
            await runner.cleanup()

    asyncio.run(main())


@asynccontextmanager
async def chat_through(
    proxy: CredentialProxy,
    base_url: str,
    path: str = "/chat/completions",
    ca_bundle: Path | None = None,
) -> AsyncIterator[tuple[str, aiohttp.ClientResponse]]:
    """A cell opened for the upstream at ``base_url`` and one chat request through it, as a
    guest's client sends it (a redirect not followed): the cell's bearer, the open response."""
    model = upstream_model(base_url, ca_bundle)
    bearer = await asyncio.to_thread(proxy.open_cell, "cell-1", model, soon())
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + path,
            json=CHAT,
            headers={"Authorization": f"Bearer {bearer}"},
            allow_redirects=False,
        ) as response,
    ):
        yield bearer, response


def test_streams_pass_through_chunk_by_chunk(proxy: CredentialProxy) -> None:
    first_seen = asyncio.Event()
    seen_headers: dict[str, str] = {}

    async def upstream(request: web.Request) -> web.StreamResponse:
        seen_headers.update(request.headers)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[]}\n\n')
        # The second chunk waits until the client has the first: a buffering proxy deadlocks.
        await asyncio.wait_for(first_seen.wait(), timeout=5)
        await response.write(
            b'data: {"choices":[],"usage":{"prompt_tokens":7,'
            b'"completion_tokens":3,"total_tokens":10}}\n\ndata: [DONE]\n\n'
        )
        await response.write_eof()
        return response

    async def client(base_url: str) -> None:
        path = "/chat/completions?api-version=1"
        async with chat_through(proxy, base_url, path) as (bearer, response):
            first = await response.content.readuntil(b"\n\n")
            assert first == b'data: {"choices":[]}\n\n'
            first_seen.set()
            rest = await response.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert (counts.input_tokens, counts.output_tokens, counts.total_tokens) == (7, 3, 10)
        assert counts.requests[0].path == "/chat/completions"  # no query string in the log
        assert bearer not in seen_headers.values()

    with_upstream(upstream, client)
    assert seen_headers["Authorization"] == f"Bearer {KEY}"


async def one_chat_in_a_cell(proxy: CredentialProxy, base_url: str) -> ProxyCellCounts:
    """One chat request through a cell opened for the upstream at ``base_url``; its counts."""
    bearer = await asyncio.to_thread(proxy.open_cell, "cell-1", upstream_model(base_url), soon())
    status, _ = await post(
        proxy.base_url + "/chat/completions", CHAT, {"Authorization": f"Bearer {bearer}"}
    )
    assert status == 200
    return await asyncio.to_thread(proxy.close_cell, "cell-1")


def test_usage_not_returned_is_none_not_zero(proxy: CredentialProxy) -> None:
    async def upstream(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": [{"message": {"content": "hi"}}]})

    async def client(base_url: str) -> None:
        counts = await one_chat_in_a_cell(proxy, base_url)
        assert counts.usage_returned is False
        assert counts.input_tokens is None and counts.total_tokens is None
        assert counts.requests[0].usage is None

    with_upstream(upstream, client)


def test_one_cell_at_a_time_and_keys_must_be_set(
    proxy: CredentialProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy.open_cell("cell-1", scripted_model(), soon(), SCRIPT)
    with pytest.raises(RunnerError, match="still open"):
        proxy.open_cell("cell-2", scripted_model(), soon(), SCRIPT)
    with pytest.raises(RunnerError, match="not the open cell"):
        proxy.close_cell("cell-2")
    proxy.close_cell("cell-1")
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(RunnerError, match=f"{KEY_ENV} .* is unset"):
        proxy.open_cell("cell-2", upstream_model("https://api.example.invalid/v1"), soon())
    with pytest.raises(RunnerError, match="need a script"):
        proxy.open_cell("cell-2", scripted_model(), soon())


def test_a_large_body_sent_after_100_continue_passes(proxy: CredentialProxy) -> None:
    """curl holds a large body back until "100 Continue"; an agent's context can pass 1 MiB."""
    body = json.dumps({**CHAT, "padding": "x" * (2 * 1024 * 1024)}).encode()

    async def upstream(request: web.Request) -> web.StreamResponse:
        return web.json_response({"received": request.content_length})

    async def client(base_url: str) -> None:
        bearer = await asyncio.to_thread(
            proxy.open_cell, "cell-1", upstream_model(base_url), soon()
        )
        port = int(proxy.base_url.rpartition(":")[2])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST /chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer {bearer}"
            f"\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = next(
            int(line.partition(b":")[2])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert json.loads(await reader.readexactly(length)) == {"received": len(body)}
        writer.close()
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert counts.requests[0].request_bytes == len(body)

    with_upstream(upstream, client)


def test_token_counts_that_are_no_counts_are_ignored(proxy: CredentialProxy) -> None:
    async def upstream(request: web.Request) -> web.StreamResponse:
        usage = {"prompt_tokens": -5, "completion_tokens": True, "total_tokens": 3}
        return web.json_response({"choices": [], "usage": usage})

    async def client(base_url: str) -> None:
        counts = await one_chat_in_a_cell(proxy, base_url)
        assert (counts.input_tokens, counts.output_tokens, counts.total_tokens) == (None, None, 3)

    with_upstream(upstream, client)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_passed_to_the_guest_never_followed(
    proxy: CredentialProxy, status: int
) -> None:
    """aiohttp follows redirects by default: a 307/308 sent the request (and the key) to the
    redirect's target, a 301/302 turned it into a bodiless GET, and the guest saw 200."""
    followed: list[str] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/elsewhere"):
            followed.append(request.method)
            return web.json_response({"choices": []})
        return web.Response(status=status, headers={"Location": "/v1/elsewhere"})

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url) as (_bearer, response):
            assert (response.status, response.headers.get("Location")) == (
                status,
                "/v1/elsewhere",
            )
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert counts.physical_posts == 1
        assert [request.status for request in counts.requests] == [status]

    with_upstream(upstream, client)
    assert followed == []


@pytest.mark.parametrize("trusted", [True, False])
def test_the_provider_is_verified_against_the_locks_ca_bundle(
    proxy: CredentialProxy, ca: LoopbackCA, trusted: bool
) -> None:
    """A provider behind a private CA: with the lock's ca_bundle the proxy trusts it; without
    one, the system trust store does not know the CA and the guest gets a 502."""

    async def upstream(request: web.Request) -> web.StreamResponse:
        return web.json_response({"choices": []})

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle if trusted else None) as (
            _bearer,
            response,
        ):
            assert response.status == (200 if trusted else 502)
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        # A certificate refused in the handshake: not a byte of the request reached anyone.
        assert [request.outcome for request in counts.requests] == [
            "forwarded" if trusted else "not_sent"
        ]
        assert (counts.physical_posts, counts.unsent_posts) == ((1, 0) if trusted else (0, 1))

    with_upstream(upstream, client, tls=ca)


def test_a_ca_bundle_that_is_no_pem_file_is_one_line(
    proxy: CredentialProxy, tmp_path: Path
) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    for bundle, why in ((tmp_path / "absent.pem", "No such file"), (tmp_path / "junk.pem", "NO_C")):
        model = upstream_model("https://127.0.0.1:9/v1", bundle)
        with pytest.raises(RunnerError, match=f"ca_bundle .* no readable PEM CA bundle: {why}"):
            proxy.open_cell("cell-1", model, soon())
    with pytest.raises(ValueError, match="only for an https"):
        upstream_model("http://127.0.0.1:9/v1", tmp_path / "junk.pem")


@asynccontextmanager
async def elsewhere() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback listener that is no provider: its address, and what each connection sent."""
    received: list[bytes] = []

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(take, "127.0.0.1", 0)
    async with server:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", received


async def raw_post(proxy: CredentialProxy, target: str, credential: str) -> bytes:
    """A POST with a request target as a client may write it (no client library tidies it)."""
    port = int(proxy.base_url.rpartition(":")[2])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(CHAT).encode()
    writer.write(
        f"POST {target} HTTP/1.1\r\nHost: proxy\r\n{credential}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer


def test_the_key_goes_to_the_provider_origin_only(
    paths: RunPaths, ca: LoopbackCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way a request could leave for another origin: environment proxies, a redirect to
    an absolute URL, request targets that name another host (refused: no API path). Only the
    provider hears of it."""
    provider_saw: list[str] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        provider_saw.append(request.headers.get("x-api-key") or request.headers["Authorization"])
        if request.query.get("go") == "away":
            return web.Response(status=307, headers={"Location": request.query["to"]})
        return web.json_response({"choices": []})

    async def client(base_url: str) -> None:
        async with elsewhere() as (address, received):
            for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
                monkeypatch.setenv(variable, f"http://{address}")
            monkeypatch.setenv(KEY_ENV, KEY)
            with CredentialProxy(paths) as proxy:
                model = upstream_model(base_url, ca.bundle)
                bearer = await asyncio.to_thread(proxy.open_cell, "cell-1", model, soon())
                away = f"go=away&to=https://{address}"
                sent = (  # Anthropic clients send x-api-key, which aiohttp kept on a redirect
                    ("/chat/completions", "Authorization: Bearer "),
                    (f"//{address}/chat/completions", "Authorization: Bearer "),
                    (f"https://{address}/chat/completions", "Authorization: Bearer "),
                    (f"/chat/completions?{away}/chat/completions", "Authorization: Bearer "),
                    (f"/chat/completions?{away}/chat/completions", "x-api-key: "),
                )
                answers = [await raw_post(proxy, target, how + bearer) for target, how in sent]
                counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
            assert received == []
        statuses = [answer.split(b" ", 2)[1] for answer in answers]
        assert statuses == [b"200", b"404", b"404", b"307", b"307"]
        assert counts.physical_posts == 3

    with_upstream(upstream, client, tls=ca)
    assert provider_saw == [f"Bearer {KEY}"] * 2 + [KEY]


def test_guest_connections_slow_in_their_headers_are_closed(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three loopback connections: one silent, one trickling its head a byte at a time, one
    idle after an answer. Each is closed within the header timeout (0.5 s) and a little."""

    async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
        try:
            while await asyncio.wait_for(reader.read(65536), timeout=seconds):
                pass
        except TimeoutError:
            return False
        return True

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"POST /chat/completions HTTP/1.1\r\nHost: proxy\r\n")
        for byte in b"X-Slow: header-that-never-ends":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.1)

    async def main(proxy: CredentialProxy) -> None:
        bearer = await asyncio.to_thread(
            proxy.open_cell, "cell-1", scripted_model(), soon(), SCRIPT
        )
        port = int(proxy.base_url.rpartition(":")[2])
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        started = time.monotonic()
        (silent, _), (slow, slow_writer), (idle, idle_writer) = connections
        trickling = asyncio.create_task(trickle(slow_writer))
        body = json.dumps(CHAT).encode()
        idle_writer.write(
            f"POST /chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer {bearer}"
            f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await asyncio.wait_for(idle.readuntil(b"\r\n\r\n"), timeout=5)
        assert head.startswith(b"HTTP/1.1 200 ")
        closed = await asyncio.gather(*(closed_within(r, 3) for r in (silent, slow, idle)))
        assert closed == [True, True, True] and time.monotonic() - started < 3
        trickling.cancel()
        for _, writer in connections:
            writer.close()
        await asyncio.to_thread(proxy.close_cell, "cell-1")

    monkeypatch.setenv(KEY_ENV, KEY)
    with CredentialProxy(paths, header_timeout=0.5) as proxy:
        asyncio.run(main(proxy))


SHAPED = "sk-ant-api03-" + "Q" * 40  # a key of the provider's shape, not the cell's


def test_keys_are_redacted_from_answers_headers_and_split_stream_chunks(
    proxy: CredentialProxy, ca: LoopbackCA
) -> None:
    """The key and a key-shaped string, each split across two chunks of an event stream (and
    in headers), never reach the guest; the stream still passes event by event."""
    first_seen = asyncio.Event()
    event = f'data: {{"error": "bad key {KEY}; try {SHAPED} or task-{"z" * 24}"}}\n\n'.encode()

    async def upstream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "X-Echo": f"Bearer {KEY}",
                "X-Hint": SHAPED,
            }
        )
        await response.prepare(request)
        await response.write(b'data: {"choices":[]}\n\n')
        await asyncio.wait_for(first_seen.wait(), timeout=5)
        cuts = (event.index(KEY.encode()) + 5, event.index(SHAPED.encode()) + 9, len(event))
        start = 0
        for cut in cuts:
            await response.write(event[start:cut])
            await asyncio.sleep(0.05)  # each piece its own chunk
            start = cut
        await response.write_eof()
        return response

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle) as (_bearer, response):
            assert await response.content.readuntil(b"\n\n") == b'data: {"choices":[]}\n\n'
            first_seen.set()
            rest = await response.read()
            headers = dict(response.headers)
        seen = rest + repr(headers).encode()
        assert KEY.encode() not in seen and SHAPED.encode() not in seen
        assert KEY[:5].encode() not in rest  # no piece of the key went ahead of the rest
        assert rest == event.replace(KEY.encode(), b"[REDACTED]").replace(
            SHAPED.encode(), b"[REDACTED]"
        )
        assert (headers["X-Echo"], headers["X-Hint"]) == ("Bearer [REDACTED]", "[REDACTED]")
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert counts.redactions == 4 == counts.requests[0].redactions

    with_upstream(upstream, client, tls=ca)


def test_a_key_in_a_json_answer_is_redacted_and_counted(
    proxy: CredentialProxy, ca: LoopbackCA
) -> None:
    async def upstream(request: web.Request) -> web.StreamResponse:
        message = f"Incorrect API key provided: {KEY}. Keys look like {SHAPED}."
        return web.json_response({"error": {"message": message}}, status=401)

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle) as (_bearer, response):
            assert response.status == 401
            answer = await response.json()
        assert answer["error"]["message"] == (
            "Incorrect API key provided: [REDACTED]. Keys look like [REDACTED]."
        )
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert (counts.redactions, counts.requests[0].redactions) == (2, 2)

    with_upstream(upstream, client, tls=ca)


def packed(data: bytes, encoding: str) -> bytes:
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


USAGE = b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'


@pytest.mark.parametrize(
    ("encoding", "event_stream"), [("gzip", False), ("deflate", False), ("gzip", True)]
)
def test_an_answer_compressed_unasked_reaches_the_guest_decoded_with_its_usage(
    proxy: CredentialProxy, ca: LoopbackCA, encoding: str, event_stream: bool
) -> None:
    """The proxy asks for identity; a provider that compresses anyway is decoded: the guest
    gets the plain bytes (no Content-Encoding) and the usage is read."""
    plain = b"data: " + USAGE + b"\n\ndata: [DONE]\n\n" if event_stream else USAGE
    kind = "text/event-stream" if event_stream else "application/json"

    async def upstream(request: web.Request) -> web.StreamResponse:
        assert request.headers["Accept-Encoding"] == "identity"
        headers = {"Content-Type": kind, "Content-Encoding": encoding}
        return web.Response(body=packed(plain, encoding), headers=headers)

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle) as (_bearer, response):
            assert response.status == 200 and "Content-Encoding" not in response.headers
            assert await response.read() == plain
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert (counts.input_tokens, counts.output_tokens, counts.total_tokens) == (7, 3, 10)
        assert counts.requests[0].response_bytes == len(plain)

    with_upstream(upstream, client, tls=ca)


def test_an_answer_in_an_encoding_the_proxy_cannot_read_is_a_502(
    proxy: CredentialProxy, ca: LoopbackCA
) -> None:
    """A br answer could hide the key from redaction: it is never passed on."""

    async def upstream(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"\x8b\x02\x80opaque", headers={"Content-Encoding": "br"})

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle) as (_bearer, response):
            assert response.status == 502
            assert b"opaque" not in await response.read()
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert (counts.physical_posts, counts.requests[0].outcome) == (1, "upstream_failed")

    with_upstream(upstream, client, tls=ca)


@pytest.mark.parametrize(
    ("encodings", "decoded"),
    [(("identity", "gzip"), True), (("gzip", "identity"), True), (("gzip", "gzip"), False)],
)
def test_every_content_encoding_line_of_an_answer_is_read(
    proxy: CredentialProxy, ca: LoopbackCA, encodings: tuple[str, ...], decoded: bool
) -> None:
    """Two Content-Encoding lines: the codings of both count, so a gzip body under a first line
    of identity is decoded (before: passed on compressed, its usage and any key unread); a body
    coded twice is not read, so it is never passed on."""
    body = USAGE
    for encoding in encodings:
        if encoding == "gzip":
            body = packed(body, "gzip")

    async def upstream(request: web.Request) -> web.StreamResponse:
        headers = CIMultiDict([("Content-Type", "application/json")])
        for encoding in encodings:
            headers.add("Content-Encoding", encoding)
        return web.Response(body=body, headers=headers)

    async def client(base_url: str) -> None:
        async with chat_through(proxy, base_url, ca_bundle=ca.bundle) as (_bearer, response):
            assert response.status == (200 if decoded else 502)
            answer = await response.read()
        assert (answer == USAGE) is decoded
        counts = await asyncio.to_thread(proxy.close_cell, "cell-1")
        assert (counts.total_tokens == 10) is decoded

    with_upstream(upstream, client, tls=ca)
