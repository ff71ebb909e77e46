"""A GET-only HTTP server on 127.0.0.1 for the tests' stand-ins of upstream servers: a function
of the request's path (and the server's own URL, for answers that link back to it) gives the
answer's body, or None for a 404; every path asked is kept, in order."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[str, str], bytes | None]  # (request path, server URL) -> body or None


@dataclass(frozen=True)
class Served:
    url: str  # http://127.0.0.1:<port>
    requests: list[str]  # every path asked, in order


@contextmanager
def serve_on_loopback(answer: Answer, content_type: str | None = None) -> Iterator[Served]:
    served = Served("", [])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests.append(self.path)
            body = answer(self.path, served.url)
            self.send_response(200 if body is not None else 404)
            if body is not None and content_type is not None:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served = Served(f"http://127.0.0.1:{server.server_address[1]}", served.requests)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
