"""The proxy sends on only inside the lock's base path: a request target is one of the API's
endpoint paths as written, or it is refused (404, ``not_an_api_path``) and recorded with why; a
body over the limit is a 413 recorded ``too_large``; nothing is answered to a request without
the cell's bearer but its 401 (no "100 Continue"). Over real loopback HTTP, the guest's bytes as
written (a raw socket: no client library tidies a target), a stand-in upstream behind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from runner.core.files import read_model
from runner.proxy import CredentialProxy, ProxyCellCounts
from runner.proxy.server import MAX_REQUEST_BYTES
from runner.proxy.target import API_ENDPOINTS, Endpoint, Refused, api_target
from runner.records.paths import RunPaths
from runner.spec.lock import Api
from tests.support.proxy_fixtures import CHAT, soon, upstream_model

BASE_PATH = "/v1/s/a"  # the lock's base path: two ".." from under it name the upstream's root


def port_of(proxy: CredentialProxy) -> int:
    return int(proxy.base_url.rpartition(":")[2])


async def raw_exchange(proxy: CredentialProxy, head: str, body: bytes = b"") -> bytes:
    """One request written as is, then the answer's head and body (by its Content-Length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(proxy))
    try:
        writer.write(head.encode() + body)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        length = next(
            (
                int(line.partition(b":")[2])
                for line in answer.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        return answer + await asyncio.wait_for(reader.readexactly(length), timeout=10)
    finally:
        writer.close()


def post_head(target: str, bearer: str, length: int, *extra: str) -> str:
    lines = [f"POST {target} HTTP/1.1", "Host: proxy", f"Authorization: Bearer {bearer}"]
    lines += [f"Content-Length: {length}", "Content-Type: application/json", *extra]
    return "\r\n".join(lines) + "\r\n\r\n"


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def through_upstream(
    proxy: CredentialProxy,
    api: Api,
    client: Callable[[str], Awaitable[None]],
) -> tuple[list[str], ProxyCellCounts]:
    """``client(bearer)`` in a cell whose provider is a loopback stand-in at ``BASE_PATH``: the
    raw targets the stand-in was sent, whatever the method, and the cell's record as written."""
    received: list[str] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        received.append(request.raw_path)
        return web.json_response({"choices": []})

    async def main() -> ProxyCellCounts:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", upstream)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base_url = f"http://127.0.0.1:{runner.addresses[0][1]}{BASE_PATH}"
        model = upstream_model(base_url).model_copy(update={"api": api})
        try:
            bearer = await asyncio.to_thread(proxy.open_cell, "cell-1", model, soon())
            await client(bearer)
            return await asyncio.to_thread(proxy.close_cell, "cell-1")
        finally:
            await runner.cleanup()

    counts = asyncio.run(main())
    return received, counts


BODY = json.dumps(CHAT).encode()

# Targets a guest may write with the cell's bearer, none of them an endpoint of the lock's API
# under its base path as written; and what is in the way. Before the fix every one ending in
# /chat/completions was sent on, ".." resolved under the base path's parent.
REFUSED: list[tuple[str, str]] = [
    ("/../../admin/chat/completions", "dot_segment"),  # upstream /v1/admin/chat/completions
    ("/%2e%2e/%2e%2e/_stats/chat/completions", "dot_segment"),  # /v1/_stats/chat/completions
    ("/%2e%2e/%2e%2e/_stats/x", "dot_segment"),
    ("/./chat/completions", "dot_segment"),
    ("/%252e%252e/%252e%252e/admin/chat/completions", "dot_segment"),  # decoded twice: ".."
    ("/x%2F..%2F..%2Fadmin/chat/completions", "encoded_slash"),  # ../.. to a decoding server
    ("/chat%2Fcompletions", "encoded_slash"),
    ("/chat%2fcompletions", "encoded_slash"),
    ("/..%5c..%5cadmin/chat/completions", "backslash"),
    ("//admin/chat/completions", "empty_segment"),
    ("/chat//completions", "empty_segment"),
    ("/chat/completions/", "empty_segment"),
    ("/%63hat/completions", "percent_encoded"),
    ("/admin/chat/completions", "unknown_endpoint"),  # the old check read only the suffix
    ("/v1/messages", "unknown_endpoint"),  # another API's endpoint
    ("/models", "unknown_endpoint"),
    ("http://127.0.0.1:9/chat/completions", "not_origin_form"),
    ("/chat/completions?x=1#y", "malformed_query"),
    ("/chat/completions?x=%zz", "malformed_query"),
]


@pytest.mark.parametrize(("target", "why"), REFUSED, ids=[target for target, _ in REFUSED])
def test_a_target_outside_the_apis_endpoints_is_refused_and_never_sent(
    proxy: CredentialProxy, paths: RunPaths, target: str, why: str
) -> None:
    answers: list[bytes] = []

    async def client(bearer: str) -> None:
        answers.append(await raw_exchange(proxy, post_head(target, bearer, len(BODY)), BODY))

    received, counts = through_upstream(proxy, "openai-completions", client)
    assert received == []
    assert status_of(answers[0]) == 404 and b"not an API path" in answers[0]
    [entry] = counts.requests
    assert (entry.outcome, entry.status, entry.refusal) == ("not_an_api_path", 404, why)
    assert entry.path == target.partition("?")[0]  # as written, the query left out
    assert (counts.physical_posts, counts.rejected_requests, counts.upstream_statuses) == (0, 0, {})
    assert read_model(paths.proxy_counts("cell-1"), ProxyCellCounts) == counts


def test_another_method_on_an_endpoint_is_refused(proxy: CredentialProxy) -> None:
    async def client(bearer: str) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                proxy.base_url + "/chat/completions", headers={"Authorization": f"Bearer {bearer}"}
            ) as response,
        ):
            assert response.status == 404

    received, counts = through_upstream(proxy, "openai-completions", client)
    assert received == []
    assert [(e.outcome, e.refusal) for e in counts.requests] == [("not_an_api_path", "not_post")]


@pytest.mark.parametrize("api", sorted(API_ENDPOINTS))
def test_each_apis_endpoint_is_sent_on_under_the_base_path_with_its_query(
    proxy: CredentialProxy, api: Api
) -> None:
    [endpoint] = API_ENDPOINTS[api]
    sent = [endpoint, endpoint + "?api-version=2024-10-21&beta=true"]

    async def client(bearer: str) -> None:
        for target in sent:
            answer = await raw_exchange(proxy, post_head(target, bearer, len(BODY)), BODY)
            assert status_of(answer) == 200

    received, counts = through_upstream(proxy, api, client)
    assert received == [BASE_PATH + target for target in sent]
    assert [(e.outcome, e.status, e.path) for e in counts.requests] == [
        ("forwarded", 200, endpoint)
    ] * 2
    assert [e.refusal for e in counts.requests] == [None, None]
    assert counts.physical_posts == 2


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_recorded_too_large(
    proxy: CredentialProxy, paths: RunPaths, framing: str
) -> None:
    """65 MiB: refused by its Content-Length before a byte is read, or as it is read when it
    comes chunked. Before the fix the record said ('forwarded', 0)."""
    size = MAX_REQUEST_BYTES + 1024 * 1024

    async def chunks() -> AsyncIterator[bytes]:
        piece = b"x" * (1024 * 1024)
        for _ in range(size // len(piece)):
            yield piece

    async def client(bearer: str) -> None:
        data = b"x" * size if framing == "content-length" else chunks()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                proxy.base_url + "/chat/completions",
                data=data,
                headers={"Authorization": f"Bearer {bearer}"},
            ) as response,
        ):
            assert response.status == 413

    received, counts = through_upstream(proxy, "openai-completions", client)
    assert received == []
    [entry] = counts.requests
    assert (entry.outcome, entry.status) == ("too_large", 413)  # was ("forwarded", 0)
    assert entry.refusal is None
    assert (counts.physical_posts, counts.unsent_posts, counts.upstream_statuses) == (0, 0, {})
    assert read_model(paths.proxy_counts("cell-1"), ProxyCellCounts) == counts


# (bearer is the cell's, target, Content-Length, Expect): the answer, with no "100 Continue"
# before it, and the outcome recorded.
NO_CONTINUE: list[tuple[bool, str, int, str, int, str]] = [
    (False, "/chat/completions", len(BODY), "100-continue", 401, "rejected"),
    (True, "/../../admin/chat/completions", len(BODY), "100-continue", 404, "not_an_api_path"),
    (True, "/chat/completions", MAX_REQUEST_BYTES + 1, "100-continue", 413, "too_large"),
    (True, "/chat/completions", len(BODY), "something-else", 417, "expectation_failed"),
]


@pytest.mark.parametrize(
    ("cells", "target", "length", "expect", "status", "outcome"),
    NO_CONTINUE,
    ids=["wrong-bearer", "outside-the-base-path", "too-large", "unknown-expectation"],
)
def test_a_refused_request_gets_no_100_continue(
    proxy: CredentialProxy,
    cells: bool,
    target: str,
    length: int,
    expect: str,
    status: int,
    outcome: str,
) -> None:
    """A client that waits for "100 Continue" before it sends the body: a request the proxy
    will not send on gets its refusal first and only (before the fix, a wrong bearer's 100
    Continue came before its 401), and the body is not asked for."""
    answers: list[bytes] = []

    async def client(bearer: str) -> None:
        offered = bearer if cells else "wrong-bearer"
        head = post_head(target, offered, length, f"Expect: {expect}")
        answers.append(await raw_exchange(proxy, head))  # no body: it waits for 100

    received, counts = through_upstream(proxy, "openai-completions", client)
    assert received == []
    assert answers[0].startswith(f"HTTP/1.1 {status} ".encode()), answers[0][:40]
    assert b"100 Continue" not in answers[0]
    assert [(e.outcome, e.status) for e in counts.requests] == [(outcome, status)]


@pytest.mark.parametrize(("target", "why"), REFUSED)
def test_api_target_refuses_what_the_proxy_refuses(target: str, why: str) -> None:
    refused = api_target(target, "openai-completions")
    assert isinstance(refused, Refused) and refused.why == why


def test_api_target_names_the_endpoint_from_its_table_and_keeps_the_query() -> None:
    assert api_target("/v1/messages?beta=true", "anthropic-messages") == Endpoint(
        "/v1/messages", "beta=true"
    )
    assert api_target("/responses", "openai-responses") == Endpoint("/responses", "")
    assert api_target("/chat/completions", "anthropic-messages") == Refused(
        "unknown_endpoint", "/chat/completions"
    )
