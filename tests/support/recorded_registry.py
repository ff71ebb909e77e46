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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.loopback_http import Answer, serve_on_loopback

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


def _recorded_answer(answers: Path) -> Answer:
    def answer(path: str, url: str) -> bytes | None:
        recorded = (answers / f"{unquote(path).strip('/')}.json").resolve()
        if not recorded.is_relative_to(answers) or not recorded.is_file():
            return None
        return recorded.read_bytes()

    return answer


@contextmanager
def recorded_registry(answers: Path = ANSWERS) -> Iterator[RecordedRegistry]:
    with serve_on_loopback(_recorded_answer(answers), "application/json") as served:
        yield RecordedRegistry(served.url, served.requests)


@pytest.fixture
def recorded_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordedRegistry]:
    """The recorded registry, npm pointed at it; a lock names its ``python_index`` itself."""
    with recorded_registry() as served:
        monkeypatch.setenv("npm_config_registry", served.npm)
        yield served
