"""The npm registry's and PyPI's answers, recorded (tests/registry_answers), served on
127.0.0.1: the resolver's checks run in the fast tier against what the real registries said
once, so a registry's change fails no CI run. ``npm_config_registry`` points npm (and the
resolver, which asks ``npm config get registry``) here, as the ``recorded_registries`` fixture
does; a lock's ``tools.python_index`` points the PyPI checks.

An answer is the file ``<answers>/<unquoted URL path>.json``; any other path is a 404, as the
real registries answer for a package they do not have. tests/registry_answers/README.md says
where the answers came from and how they were trimmed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

ANSWERS = Path(__file__).resolve().parents[1] / "registry_answers"


@dataclass(frozen=True)
class RecordedRegistry:
    url: str  # http://127.0.0.1:<port>
    requests: list[str]  # every path asked, in order

    @property
    def npm(self) -> str:
        return f"{self.url}/npm/"

    @property
    def python_index(self) -> str:
        return f"{self.url}/pypi/simple"


@contextmanager
def recorded_registry(answers: Path = ANSWERS) -> Iterator[RecordedRegistry]:
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            answer = (answers / f"{unquote(self.path).strip('/')}.json").resolve()
            if not answer.is_relative_to(answers) or not answer.is_file():
                self.send_error(404)
                return
            body = answer.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield RecordedRegistry(f"http://127.0.0.1:{server.server_address[1]}", requests)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def recorded_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordedRegistry]:
    """The recorded registry, npm pointed at it; a lock names its ``python_index`` itself."""
    with recorded_registry() as served:
        monkeypatch.setenv("npm_config_registry", served.npm)
        yield served
