"""The content-addressed store and the verified download into it (a loopback server)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from runner.artifacts.fetch import FetchReport, Wanted, fetch_all
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore, CorruptArtifact, Integrity
from runner.core.errors import RunnerError
from runner.core.roots import CACHE_ENV

DATA = b"frozen artifact bytes\n" * 100
SHA256 = "sha256:" + hashlib.sha256(DATA).hexdigest()
SRI = "sha512-" + base64.b64encode(hashlib.sha512(DATA).digest()).decode()


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(CachePaths(tmp_path / "cache"))


def test_paths_default_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert (
        CachePaths.default().artifacts == Path(__file__).resolve().parents[1] / ".cache/artifacts"
    )
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    paths = CachePaths.default()
    assert paths.artifacts == tmp_path / "artifacts"
    assert paths.blob("ab" * 32) == tmp_path / "artifacts" / "sha256" / ("ab" * 32)


def test_add_and_read_back(store: ArtifactStore) -> None:
    digest = store.add_bytes(DATA, "thing.tgz")
    assert digest == SHA256
    assert store.blob(digest).read_bytes() == DATA
    assert store.has(digest)
    assert not list(store.paths.tmp.iterdir())


def test_damaged_blob_is_refused_then_dropped(store: ArtifactStore) -> None:
    digest = store.add_bytes(DATA, "thing.tgz")
    store.paths.blob(digest.removeprefix("sha256:")).write_bytes(DATA + b"tampered")
    with pytest.raises(CorruptArtifact, match="damaged on disk"):
        store.blob(digest)
    assert not store.has(digest)
    assert not store.paths.blob(digest.removeprefix("sha256:")).exists()


def test_missing_blob_and_bad_digest(store: ArtifactStore) -> None:
    assert not store.has("sha256:" + "0" * 64)
    with pytest.raises(RunnerError, match="not a 'sha256:<hex>' digest"):
        store.blob("md5:abc")


def test_integrity_parse_takes_the_strongest() -> None:
    sha1 = "sha1-" + base64.b64encode(hashlib.sha1(DATA).digest()).decode()
    integrity = Integrity.parse(f"{sha1} {SRI}")
    assert integrity == Integrity("sha512", hashlib.sha512(DATA).hexdigest())
    with pytest.raises(CorruptArtifact):
        Integrity.parse("md5-AAAA")


@pytest.fixture
def server() -> Iterator[str]:
    """A loopback HTTP server for one file; torn down with the test."""
    loop = asyncio.new_event_loop()

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=DATA)

    app = web.Application()
    app.router.add_get("/thing.tgz", serve)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    asyncio.set_event_loop(loop)
    yield f"http://127.0.0.1:{port}/thing.tgz"
    loop.run_until_complete(runner.cleanup())
    loop.close()
    asyncio.set_event_loop(None)


def _fetch(store: ArtifactStore, wanted: Wanted) -> FetchReport:
    console = Console(quiet=True)
    return asyncio.get_event_loop().run_until_complete(fetch_all(store, [wanted], console))


def test_download_verified_by_npm_integrity_then_cached(store: ArtifactStore, server: str) -> None:
    wanted = Wanted(server, "thing.tgz", integrity=SRI)
    first = _fetch(store, wanted)
    assert first.downloaded_files == 1 and first.fetched[server].digest == SHA256
    second = _fetch(store, wanted)
    assert second.downloaded_files == 0 and second.cached_files == 1
    assert "downloaded nothing" in second.summary()


def test_download_with_wrong_digest_leaves_nothing(store: ArtifactStore, server: str) -> None:
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(CorruptArtifact, match="the source says"):
        _fetch(store, Wanted(server, "thing.tgz", sha256=wrong))
    assert not store.paths.blob(SHA256.removeprefix("sha256:")).exists()
    assert not list(store.paths.tmp.iterdir())
