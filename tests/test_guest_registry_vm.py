"""A registry base image in the real arm64 guest: pulled on the host from a loopback registry
into the artifact store, loaded offline in the guest by ``guest.registry_image`` (through
pyinfra, as the deploy runs it), its digest the pinned one there, and a task Dockerfile's FROM
of its mapped name builds with ``--pull=never``.

Uses the tests' lab (tests/support/vm_fixtures.py). What it adds to the lab (the image, its tags,
the image built on it) is removed at the end, so the lab's later audits see what they froze.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.artifacts.oci import pull_image
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.oci import OciImage, read_oci_archive
from runner.core.roots import REPO_ROOT
from runner.lab.layout import GUEST
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport
from runner.spec.lock import RegistryImage
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import PinnedArtifact
from tests.support.loopback_registry import loopback_registry
from tests.support.vm_fixtures import VM_TEST_LAB, vm_lab  # noqa: F401  (fixture)

pytestmark = [pytest.mark.vm, pytest.mark.guest]

FROM_NAME = "bench-tiny"
CHILD = "localhost/registry-child:1"
CONTEXT = "/tmp/bench-tiny-context"
ALL_UNCHANGED = re.compile(r"Grand total\s+(\d+)\s+-\s+-\s+\1\s*$", re.MULTILINE)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> tuple[PinnedArtifact, OciImage]:
    """The tiny arm64 image, pushed to a loopback registry and pulled by its digest into the
    store the guest reads over 9p (the registry is gone before the guest is asked anything)."""
    work = tmp_path_factory.mktemp("registry")
    store = ArtifactStore(CachePaths.default())
    with loopback_registry(work) as served:
        image = RegistryImage(
            f"{served.address}/bench/tiny", served.push_tiny_image(work, "bench/tiny"), ()
        )
        artifact = asyncio.run(pull_image(image, GuestPlatform("aarch64"), store))
    return artifact, read_oci_archive(store.blob(artifact.sha256))


@pytest.fixture(scope="module")
def guest(vm_lab: LabState) -> Iterator[GuestTransport]:  # noqa: F811
    with SshTransport.for_lab(load_lab_state(LabPaths.for_lab(VM_TEST_LAB))).connect(
        120
    ) as transport:
        # The artifact share, as provisioning has it (a freeze unmounts it: QEMU cannot save a
        # guest with a 9p export mounted); unmounted again at the end, as the freeze left it.
        share = GUEST.artifacts_mount
        transport.check(f"mountpoint -q {share} || mount {share}", timeout=120)
        yield transport
        transport.exec(
            f"podman rmi --force {CHILD} {FROM_NAME} >/dev/null 2>&1; rm -rf {CONTEXT}; "
            f"umount {share}",
            timeout=300,
        )


def _load(
    artifact: PinnedArtifact, image: OciImage, work: Path
) -> subprocess.CompletedProcess[str]:
    """``guest.registry_image`` on the lab's guest, as a one-operation pyinfra deploy."""
    deploy = work / "load_registry_image.py"
    deploy.write_text(
        "from deploy.guest import operations as guest\n"
        "guest.registry_image(\n"
        f"    name={f'Registry base image {FROM_NAME}'!r},\n"
        f"    archive={str(GUEST.blob(artifact.sha256))!r},\n"
        f"    digest={artifact.version!r},\n"
        f"    image_id={image.image_id!r},\n"
        f"    names=({FROM_NAME!r},),\n"
        ")\n"
    )
    python_path = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        ["pyinfra", "-y", "inventory/local.py", str(deploy), "--limit", "lab_guests"],
        cwd=REPO_ROOT,
        env={**os.environ, "LAB": VM_TEST_LAB, "PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_registry_image_loads_offline_at_its_digest_and_a_from_of_it_builds(
    pinned: tuple[PinnedArtifact, OciImage], guest: GuestTransport, tmp_path: Path
) -> None:
    artifact, image = pinned
    guest.exec(f"podman rmi --force {CHILD} {FROM_NAME} >/dev/null 2>&1", timeout=300)
    loaded = _load(artifact, image, tmp_path)
    assert loaded.returncode == 0, loaded.stdout[-3000:] + loaded.stderr[-3000:]
    inspect = f"podman image inspect --format '{{{{.Digest}}}} {{{{.Id}}}}' {FROM_NAME}"
    assert guest.check(inspect, timeout=300).stdout.split() == [artifact.version, image.image_id]

    # Loaded again: nothing to do, and pyinfra says so.
    again = _load(artifact, image, tmp_path)
    said = again.stdout + again.stderr  # pyinfra writes its table to stderr
    assert again.returncode == 0 and ALL_UNCHANGED.search(said), said[-3000:]

    # A task's FROM of the mapped name, built with no pull (the guest reaches no registry).
    dockerfile = f"FROM {FROM_NAME}\nCOPY note /note\n"
    guest.check(
        f"mkdir -p {CONTEXT} && printf %s {shlex.quote(dockerfile)} > {CONTEXT}/Dockerfile "
        f"&& echo built > {CONTEXT}/note",
        timeout=60,
    )
    guest.check(f"podman build --quiet --pull=never -t {CHILD} {CONTEXT}", timeout=600)
    parents = guest.check(f"podman image tree {CHILD}", timeout=300).stdout
    assert f"localhost/{FROM_NAME}:latest" in parents, parents
