"""A registry base image, pinned by manifest digest, against a real registry on 127.0.0.1.

Debian's docker-registry serves a tiny image pushed to it with skopeo; a lock maps a FROM name to
``127.0.0.1:<port>/bench/tiny@sha256:<digest>`` beside a local base image. ``runner resolve
--update`` (the ``images`` section only: Debian, PyPI and npm are not what this is about) puts
the OCI archive into the store and records it, and the guest's plan loads it from there;
``runner resolve`` on a fresh cache pulls the same archive byte for byte; a digest the registry
does not have fails closed in one line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from deploy.guest import plan
from deploy.guest.plan import RegistryBaseImage
from runner.artifacts.resolver import Section, UnavailableArtifacts
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.cli import main as cli_main
from runner.cli import resolve as cli_resolve
from runner.cli.resolve import fetch_resolution, update_resolution
from runner.core.errors import InputError
from runner.core.oci import read_oci_archive
from runner.lab.layout import GUEST
from runner.spec.lock import load_lock
from runner.spec.resolution import Resolution, environment_fingerprint
from tests.support.loopback_registry import LoopbackRegistry, loopback_registry

REPO = Path(__file__).resolve().parents[1]
IMAGES: frozenset[Section] = frozenset({"images"})
NOT_PUSHED = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackRegistry, str]]:
    work = tmp_path_factory.mktemp("registry")
    with loopback_registry(work) as served:
        yield served, served.push_tiny_image(work, "bench/tiny")


def _lock(tmp_path: Path, reference: str) -> Path:
    """The demo lock, renamed, its tasks' FROM names mapping a registry image and a local one."""
    text = (REPO / "locks" / "demo.toml").read_text().replace('name = "demo"', 'name = "oci"')
    mixed = f'base_images = {{ "bench-base" = "localhost/base:1", "bench-tiny" = "{reference}" }}'
    text = re.sub(r"^base_images = .*$", mixed, text, count=1, flags=re.MULTILINE)
    path = tmp_path / "locks" / "oci.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_pinned_image_is_stored_recorded_and_fetched_again_byte_for_byte(
    registry: tuple[LoopbackRegistry, str], tmp_path: Path
) -> None:
    served, digest = registry
    repository = f"{served.address}/bench/tiny"
    lock_path = _lock(tmp_path, f"{repository}@{digest}")
    lines = update_resolution(lock_path, CachePaths(tmp_path / "a"), IMAGES)
    assert f"added oci-image:{repository} {digest}" in lines
    resolved = lock_path.with_name("oci.resolved.json")
    resolution = Resolution.model_validate_json(resolved.read_bytes())
    (image,) = resolution.artifacts
    assert (image.kind, image.name, image.version) == ("oci-image", repository, digest)
    assert image.url == f"docker://{repository}@{digest}"
    assert resolution.tools.skopeo is not None and resolution.tools.skopeo.startswith("skopeo ")
    blob = CachePaths(tmp_path / "a").blob(image.sha256.removeprefix("sha256:"))
    assert blob.stat().st_size == image.size
    stored = read_oci_archive(blob)
    assert stored.manifest_digest == digest
    assert (stored.os, stored.architecture) == ("linux", "arm64")
    # The archive is part of what the guest is made of.
    assert resolution.environment_fingerprint != environment_fingerprint(
        resolution.lock_environment, (), resolution.harness_trees
    )

    # The guest's plan: the registry image loaded from that archive, the local one made.
    lock = load_lock(lock_path)
    (planned,) = plan._registry_images(lock, resolution, ArtifactStore(CachePaths(tmp_path / "a")))
    assert planned == RegistryBaseImage(
        f"{repository}@{digest}",
        digest,
        stored.image_id,
        str(GUEST.blob(image.sha256)),
        ("bench-tiny",),
    )
    assert plan._base_images(lock) == {"localhost/base:1": ("bench-base",)}

    # A fresh cache: pulled again, the same bytes (the recorded sha256); the record untouched.
    recorded = resolved.read_bytes()
    fetched = fetch_resolution(lock_path, CachePaths(tmp_path / "b"))
    assert "downloaded 1 artifacts" in fetched[0]
    assert "as recorded, no change (1 artifacts" in fetched[1]
    assert CachePaths(tmp_path / "b").blob(image.sha256.removeprefix("sha256:")).is_file()
    assert "downloaded nothing" in fetch_resolution(lock_path, CachePaths(tmp_path / "b"))[0]
    assert resolved.read_bytes() == recorded
    assert "no change" in update_resolution(lock_path, CachePaths(tmp_path / "b"), IMAGES)


def test_a_digest_the_registry_does_not_have_fails_closed_in_one_line(
    registry: tuple[LoopbackRegistry, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    served, _ = registry
    reference = f"{served.address}/bench/tiny@{NOT_PUSHED}"
    lock_path = _lock(tmp_path, reference)
    cache = CachePaths(tmp_path / "c")
    with pytest.raises(UnavailableArtifacts) as refused:
        update_resolution(lock_path, cache, IMAGES)
    (line,) = refused.value.lines
    assert line.startswith(f"{reference}: the registry does not give it: ")
    assert "manifest unknown" in line
    assert not lock_path.with_name("oci.resolved.json").exists()
    assert not any(cache.artifacts.glob("sha256/*"))

    # Through the command: one line on stderr, exit code 1, no traceback.
    update = partial(update_resolution, paths=cache, sections=IMAGES)
    monkeypatch.setattr(cli_resolve, "update_resolution", update)
    monkeypatch.setattr(sys, "argv", ["runner", "resolve", "--update", str(lock_path)])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code == 1
    stderr = capsys.readouterr().err
    assert stderr == f"runner: error: {line}\n"


def test_a_malformed_registry_value_is_refused_by_the_lock(tmp_path: Path) -> None:
    lock_path = _lock(tmp_path, "bench/tiny@sha256:abc")
    with pytest.raises(InputError, match=r"REGISTRY/REPO@sha256:<64 hex>"):
        load_lock(lock_path)
