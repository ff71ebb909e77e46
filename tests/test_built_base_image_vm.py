"""A FROM name gives what it says, in the real arm64 guest: the demo lock maps python:3.11-slim
to the image the project builds (images.base: bookworm's Python 3.11 with pip, from pinned Debian
packages, loaded in the guest by its manifest digest). A Dockerfile FROM it gets Python 3.11 and
`python`, and its `pip install` of a wheel of the frozen set is served by the lab's mirror; no
file of the guest's own (its Harbor venv, Podman, its Python 3.13) is in the image.

Uses the tests' lab (tests/support/vm_fixtures.py); the image built here is removed at the end.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest

from runner.core.roots import REPO_ROOT
from runner.lab.layout import GUEST
from runner.lab.mirror import lab_mirror, read_requests
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport
from tests.support.vm_fixtures import VM_TEST_LAB, vm_lab  # noqa: F401  (fixture)

pytestmark = [pytest.mark.vm, pytest.mark.guest]

CHILD = "localhost/built-base-child:1"
CONTEXT = "/tmp/built-base-context"
# A pure-Python wheel of the demo's frozen set (one of Harbor's), with no dependencies.
WHEEL = "pyjwt==2.15.1"
DOCKERFILE = f"""FROM python:3.11-slim
RUN python --version && pip install {WHEEL}
"""
# Each line one check, run in a container of the built image: what the name says is there, and
# what only the guest has is not.
CHECKS = (
    "python -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'",
    "python -c 'import jwt; assert jwt.__version__ == \"2.15.1\"'",
    "grep -q '^VERSION_CODENAME=bookworm$' /etc/os-release",
    "test -e /usr/lib/ssl/openssl.cnf",
    "! ls /usr/lib/python3*/EXTERNALLY-MANAGED",
    "! command -v podman",
    f"! test -e {GUEST.harbor_venv}",
    "! test -e /usr/lib/python3.13",
)


@pytest.fixture(scope="module")
def guest(vm_lab: LabState) -> Iterator[GuestTransport]:  # noqa: F811
    with SshTransport.for_lab(load_lab_state(LabPaths.for_lab(VM_TEST_LAB))).connect(
        120
    ) as transport:
        yield transport
        transport.exec(f"podman rmi --force {CHILD} >/dev/null 2>&1; rm -rf {CONTEXT}", timeout=300)


def test_python_311_slim_is_python_311_with_pip_from_the_frozen_set(guest: GuestTransport) -> None:
    resolution = REPO_ROOT / "locks" / "demo.resolved.json"
    with lab_mirror(VM_TEST_LAB, resolution) as log:
        start = log.stat().st_size if log.exists() else 0
        guest.check(
            f"mkdir -p {CONTEXT} && printf %s {shlex.quote(DOCKERFILE)} > {CONTEXT}/Dockerfile "
            f"&& podman build --pull=never -t {CHILD} {CONTEXT}",
            timeout=900,
        )
        requests, _ = read_requests(log, start)
    assert [r.item for r in requests if r.miss] == []
    assert "pypi:pyjwt" in {r.item for r in requests}
    for check in CHECKS:
        found = guest.exec(f"podman run --rm {CHILD} sh -c {shlex.quote(check)}", timeout=300)
        assert found.ok, f"{check}: {found.stdout}{found.stderr}"
