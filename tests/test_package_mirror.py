"""The lab's package mirror (runner.lab.mirror) on loopback: the frozen set and nothing else.

A real server process on a free 127.0.0.1 port, serving a resolution made here: one real .deb
(built with dpkg-deb) and one wheel-named file, from an artifact store in tmp_path. The last
tests run the mirror on an event loop of their own in this process, with a stand-in upstream.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import socket
import subprocess
import threading
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.files import read_model, write_model
from runner.core.roots import CACHE_ENV
from runner.lab.mirror import (
    FrozenSet,
    Mirror,
    MirrorLog,
    Upstream,
    read_requests,
    running_mirror,
    start_server,
)
from runner.spec.resolution import PinnedArtifact, Resolution, ResolverTools

LOCK_ENVIRONMENT = "sha256:" + "1" * 64


def _deb(work: Path, name: str = "bench-hello") -> Path:
    package = work / f"pkg-{name}"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: bench <b@x>\n"
        "Description: a package of the mirror test\n"
    )
    deb = work / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(package), str(deb)], check=True, capture_output=True)
    return deb


def _artifact(
    store: ArtifactStore, path: Path, kind: str, name: str, suite: str | None = None
) -> PinnedArtifact:
    digest = store.add_file(path)
    return PinnedArtifact.model_validate(
        {"kind": kind, "name": name, "version": "1.0", "url": f"https://x/{path.name}",
         "filename": path.name, "sha256": digest, "size": path.stat().st_size, "suite": suite}
    )  # fmt: skip


@pytest.fixture
def resolution_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    store = ArtifactStore(CachePaths(tmp_path / "cache"))
    wheel = tmp_path / "bench_tool-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a zip, but the mirror serves bytes")
    resolution = Resolution(
        lock_name="mirror-test",
        lock_environment=LOCK_ENVIRONMENT,
        arch="aarch64",
        suite="trixie",
        tools=ResolverTools(apt="apt 3", npm="11", pip="pip 25"),
        artifacts=(
            _artifact(store, _deb(tmp_path), "deb", "bench-hello"),
            # Taken from another release than the guest's (as a bookworm base image's are).
            _artifact(store, _deb(tmp_path, "bench-old"), "base-deb", "bench-old", "bookworm"),
            _artifact(store, wheel, "verifier-wheel", "Bench_Tool"),
        ),
        harness_trees=(),
    )
    path = tmp_path / "mirror-test.resolved.json"
    write_model(path, resolution)
    return path


@pytest.fixture
def mirror(tmp_path: Path, resolution_file: Path) -> Iterator[tuple[str, Path]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "mirror.jsonl"
    with running_mirror(resolution_file, port, log):
        yield f"http://127.0.0.1:{port}", log


def _get(url: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_the_frozen_set_is_served_as_an_apt_repository_and_a_simple_index(mirror):
    base, log = mirror
    status, packages = _get(f"{base}/debian/./Packages")
    assert status == 200
    assert b"Package: bench-hello\n" in packages
    assert b"Filename: ./bench-hello_1.0_all.deb\n" in packages
    assert _get(f"{base}/debian/Release")[0] == 200
    assert _get(f"{base}/debian/bench-hello_1.0_all.deb")[1].startswith(b"!<arch>")
    status, page = _get(f"{base}/simple/bench-tool/")  # PEP 503's normalized name
    assert status == 200
    assert b'href="../../files/bench_tool-1.0-py3-none-any.whl#sha256=' in page
    assert _get(f"{base}/files/bench_tool-1.0-py3-none-any.whl", "HEAD") == (200, b"")
    requests, _ = read_requests(log, 0)
    assert [r.miss for r in requests] == [False] * 5


def test_another_release_s_index_holds_only_the_debs_taken_from_it(mirror):
    base, log = mirror
    status, bookworm = _get(f"{base}/debian/bookworm/Packages")
    assert status == 200
    assert b"Package: bench-old\n" in bookworm and b"bench-hello" not in bookworm
    assert b"bench-old" not in _get(f"{base}/debian/Packages")[1]  # never the guest's index
    assert _get(f"{base}/debian/bullseye/Packages") == (200, b"")
    assert b"Suite: frozen" in _get(f"{base}/debian/bookworm/Release")[1]
    assert _get(f"{base}/debian/bookworm/InRelease")[0] == 404
    assert _get(f"{base}/debian/bookworm/bench-old_1.0_all.deb")[1].startswith(b"!<arch>")
    requests, _ = read_requests(log, 0)
    assert [(r.item, r.miss) for r in requests] == [
        ("index:bookworm/Packages", False),
        ("index:Packages", False),
        ("index:bullseye/Packages", False),
        ("index:bookworm/Release", False),
        ("index:bookworm/InRelease", False),
        ("deb:bookworm/bench-old_1.0_all.deb", False),
    ]


def test_anything_else_is_refused_and_logged_as_a_miss(mirror):
    base, log = mirror
    assert _get(f"{base}/simple/requests/")[0] == 404
    assert _get(f"{base}/debian/cowsay_3.03_all.deb")[0] == 404
    assert _get(f"{base}/debian/InRelease")[0] == 404  # apt's optional index: not a miss
    requests, offset = read_requests(log, 0)
    assert [(r.item, r.miss) for r in requests] == [
        ("pypi:requests", True),
        ("deb:cowsay_3.03_all.deb", True),
        ("index:InRelease", False),
    ]
    assert read_requests(log, offset) == ((), offset)  # a cell reads only its own lines


def test_a_withheld_package_is_a_miss(tmp_path, mirror):
    resolution_file = tmp_path / "mirror-test.resolved.json"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "withheld.jsonl"
    with running_mirror(resolution_file, port, log, withhold=("bench-tool",)):
        assert _get(f"http://127.0.0.1:{port}/simple/bench-tool/")[0] == 404
    ((request,), _) = read_requests(log, 0)
    assert (request.item, request.miss) == ("pypi:bench-tool", True)


def test_the_mirror_stops_on_sigterm_even_when_its_parent_ignores_it(tmp_path, mirror):
    """An ignored SIGTERM survives exec; the mirror takes it back, so running_mirror's
    terminate() ends it (else its wait would time out)."""
    resolution_file = tmp_path / "mirror-test.resolved.json"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with running_mirror(resolution_file, port, tmp_path / "ignored.jsonl"):
            assert _get(f"http://127.0.0.1:{port}/simple/bench-tool/")[0] == 200
    finally:
        signal.signal(signal.SIGTERM, handler)


@contextmanager
def mirror_in_process(resolution: Path, log: Path, upstream: Upstream | None) -> Iterator[str]:
    """The mirror of ``resolution`` on a free port, served by a loop in a thread of this
    process (as the proxy's), stopped after the block."""
    store = ArtifactStore(CachePaths.default())
    frozen = FrozenSet.of(read_model(resolution, Resolution), store, frozenset())
    mirror = Mirror(frozen, store, MirrorLog(log), upstream)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(start_server(mirror, 0), loop).result()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


class BlockingUpstream:
    """A recording's upstream whose project listings are held until ``release`` is set, as a
    slow fetch from PyPI is (RecordingUpstream's methods block)."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def packages_index(self, frozen: bytes) -> bytes:
        return frozen

    def file(self, kind: str, name: str) -> bytes | None:
        return None

    def project_files(self, name: str) -> list[tuple[str, str]] | None:
        self.entered.release()
        self.release.wait(timeout=60)
        return [(f"{name}-1.0.tar.gz", "sha256:" + "0" * 64)]

    def archive_file(self, path: str) -> bytes | None:
        return None


def test_the_frozen_set_is_served_while_two_upstream_fetches_block(
    tmp_path: Path, resolution_file: Path
) -> None:
    upstream = BlockingUpstream()
    log = tmp_path / "recording.jsonl"
    with mirror_in_process(resolution_file, log, upstream) as base, ThreadPoolExecutor(2) as pool:
        try:
            held = [pool.submit(_get, f"{base}/simple/{name}/") for name in ("slow-a", "slow-b")]
            # Both fetches are under way at once, and the frozen set is still answered.
            assert upstream.entered.acquire(timeout=30) and upstream.entered.acquire(timeout=30)
            assert _get(f"{base}/debian/Packages")[0] == 200
            assert _get(f"{base}/files/bench_tool-1.0-py3-none-any.whl") == (
                200, b"not really a zip, but the mirror serves bytes",
            )  # fmt: skip
            assert not any(request.done() for request in held)
        finally:
            upstream.release.set()
        pages = [request.result() for request in held]
    assert [status for status, _ in pages] == [200, 200]
    assert b"slow-a-1.0.tar.gz" in pages[0][1]
    requests, _ = read_requests(log, 0)
    assert sorted((r.item, r.upstream) for r in requests if r.upstream) == [
        ("pypi:slow-a", True),
        ("pypi:slow-b", True),
    ]


def test_a_large_blob_streams_from_the_store_with_its_length_never_read_whole(
    tmp_path: Path, resolution_file: Path
) -> None:
    size = 64 << 20
    big = tmp_path / "big_tool-1.0-py3-none-any.whl"
    with big.open("wb") as writer:
        for number in range(size >> 20):
            writer.write(bytes([number]) * (1 << 20))
    store = ArtifactStore(CachePaths.default())
    resolution = read_model(resolution_file, Resolution)
    wheel = _artifact(store, big, "wheel", "big-tool")
    content = resolution.model_dump(exclude={"environment_fingerprint"})  # the new one: made
    write_model(
        resolution_file,
        Resolution.model_validate({**content, "artifacts": (*resolution.artifacts, wheel)}),
    )
    url = f"/files/{big.name}"
    with mirror_in_process(resolution_file, tmp_path / "big.jsonl", None) as base:
        with urllib.request.urlopen(urllib.request.Request(base + url, method="HEAD")) as head:
            assert head.headers["Content-Length"] == str(size)
        tracemalloc.start()
        try:
            with urllib.request.urlopen(base + url, timeout=60) as answer:
                headers, digest = answer.headers, hashlib.sha256()
                while chunk := answer.read(1 << 20):
                    digest.update(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert headers["Content-Length"] == str(size) and "Transfer-Encoding" not in headers
    assert f"sha256:{digest.hexdigest()}" == wheel.sha256
    assert peak < size // 8  # the server's chunks and the client's, not the file
