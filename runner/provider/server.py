"""The offline scripted provider: a stand-in for a model endpoint, on 127.0.0.1 only.

It answers the three API shapes from the loaded script, returns usage on every answer, obeys the
script's fault plan, and counts every POST it receives (to check against the proxy's count).
It accepts only its own key, so a request that reaches it with anything else (a bearer the proxy
failed to replace) is refused.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from aiohttp import web

from runner.provider.script import PROVIDER_MARKER, Fault, ProviderScript
from runner.provider.shapes import Reply, Shape, next_turn_index, shape_for_path

LOOPBACK = "127.0.0.1"


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": PROVIDER_MARKER}}, status=status
    )


class ScriptedProvider:
    """One script at a time (cells run strictly one at a time); ``load_script`` resets the count."""

    def __init__(self, api_key: str, script: ProviderScript | None = None) -> None:
        self._api_key = api_key
        self._script = script
        self.posts_received = 0
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    @property
    def api_key(self) -> str:
        return self._api_key

    def load_script(self, script: ProviderScript) -> None:
        self._script = script
        self.posts_received = 0

    def application(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._answer)
        return app

    async def start(self, port: int = 0) -> str:
        # A stand-in may abandon answers it is still stalling when it stops.
        self._runner = web.AppRunner(self.application(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.base_url = f"http://{LOOPBACK}:{bound}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _authorized(self, request: web.Request) -> bool:
        offered = request.headers.get("x-api-key") or request.headers.get(
            "Authorization", ""
        ).removeprefix("Bearer ")
        return secrets.compare_digest(offered.encode(), self._api_key.encode())

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.posts_received += 1
        post = self.posts_received
        if not self._authorized(request):
            return _error(401, "invalid api key")
        shape = shape_for_path(request.path)
        if shape is None:
            return _error(404, f"no such endpoint: {request.path}")
        if self._script is None:
            return _error(503, "no script loaded")
        raw = await request.read()
        try:
            body: dict[str, Any] = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not JSON")
        fault = self._script.fault_for(post)
        if fault is not None and fault.kind == "stall":
            await asyncio.sleep(fault.seconds)
        if fault is not None and fault.kind == "http_error":
            return _error(fault.status, f"scripted fault on POST {post}")
        reply = self._reply(raw, body)
        if body.get("stream"):
            return await self._stream(request, shape, reply, body, fault)
        return web.json_response(shape.body(reply))

    def _reply(self, raw: bytes, body: dict[str, Any]) -> Reply:
        assert self._script is not None
        index = next_turn_index(raw)
        turn = self._script.turn(index)
        # Token counts are a deterministic stand-in (about four bytes a token), never zero.
        return Reply(
            turn=turn,
            turn_index=index,
            model=str(body.get("model", "")),
            input_tokens=max(1, len(raw) // 4),
            output_tokens=max(1, len(turn.model_dump_json()) // 4),
            usage_details=self._script.usage_details,
        )

    async def _stream(
        self,
        request: web.Request,
        shape: Shape,
        reply: Reply,
        body: dict[str, Any],
        fault: Fault | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        events = shape.events(reply, body)
        cut = len(events) // 2 if fault is not None and fault.kind == "disconnect" else None
        for number, event in enumerate(events):
            if number == cut and request.transport is not None:
                request.transport.close()
                return response
            await response.write(event)
        await response.write_eof()
        return response
