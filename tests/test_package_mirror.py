"""The lab's package mirror (runner.lab.mirror) on loopback: the frozen set and nothing else.

A real server process on a free 127.0.0.1 port, serving a resolution made here: one real .deb
(built with dpkg-deb) and one wheel-named file, from an artifact store in tmp_path.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.files import write_model
from runner.core.roots import CACHE_ENV
from runner.lab.mirror import read_requests, running_mirror
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
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
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
    resolution_file = tmp_path / "mirror-test.resolved.json"
    write_model(resolution_file, resolution)
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
