"""The host's npm installs fail in bounded time with npm's reason: a registry on 127.0.0.1 that
accepts connections and never answers, and one that has no such package."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.artifacts.hosttools import npm_install
from runner.core.errors import RunnerError
from tests.support.loopback_http import serve_on_loopback


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A port that accepts and never answers (the listen backlog holds the connections)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"


def test_an_unanswering_registry_fails_the_install_within_its_timeout(
    silent_registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("npm_config_registry", silent_registry)
    started = time.monotonic()
    with pytest.raises(RunnerError, match=r"left-pad@1\.3\.0 failed: network timeout at: http"):
        npm_install("left-pad", "1.3.0", tmp_path, fetch_timeout_s=2, fetch_retries=0)
    assert time.monotonic() - started < 60  # npm's own defaults would wait 5 min a request
    assert [p.name for p in tmp_path.iterdir()] == []  # no half install left behind


def test_a_package_the_registry_lacks_is_named_with_its_404(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve_on_loopback(lambda path, url: None) as registry:
        monkeypatch.setenv("npm_config_registry", registry.url + "/")
        with pytest.raises(RunnerError, match=r"failed: 404 Not Found - GET http://127\.0\.0\.1"):
            npm_install("left-pad", "1.3.0", tmp_path, fetch_retries=0)
    assert registry.requests == ["/left-pad"]
