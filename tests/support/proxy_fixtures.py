"""The credential proxy's test fixtures, over real loopback HTTP: a run directory, a running
proxy whose provider key is ``KEY`` in ``KEY_ENV``, and the models the tests name (the offline
scripted provider, or an upstream on loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths
from runner.spec.lock import Model

KEY_ENV = "PROXY_TEST_PROVIDER_KEY"
KEY = "real-provider-key-" + "x" * 24
CHAT = {"model": "reference-solution", "messages": [{"role": "user", "content": "hi"}]}


def scripted_model(api: str = "openai-completions") -> Model:
    """The offline scripted provider (the only stand-in for a model provider)."""
    return Model(
        id="scripted",
        provider="scripted",
        model="reference-solution",
        thinking="off",
        api=api,
        base_url="scripted://local",
        key_env=KEY_ENV,
    )  # type: ignore[arg-type]


def upstream_model(base_url: str, ca_bundle: Path | None = None) -> Model:
    return Model(
        id="upstream",
        provider="test",
        model="m",
        thinking="off",
        api="openai-completions",
        base_url=base_url,
        key_env=KEY_ENV,
        ca_bundle=None if ca_bundle is None else str(ca_bundle),
    )


def soon(seconds: float = 300) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run")


@pytest.fixture
def proxy(paths: RunPaths, monkeypatch: pytest.MonkeyPatch) -> Iterator[CredentialProxy]:
    monkeypatch.setenv(KEY_ENV, KEY)
    with CredentialProxy(paths) as running:
        yield running
