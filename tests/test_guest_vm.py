"""The provisioned arm64 guest, for real: versions equal the lock's, each task's image was built
from the local base image and its container runs with the frozen harnesses bound in, and a
second deploy changes nothing.

Uses the tests' lab (tests/vm_fixtures.py, deployed in full when missing: tens of minutes under
TCG); its guest is converged again here (under a minute when nothing changed).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.command import StringCommand

from deploy.guest import operations as guest_ops
from runner.core.roots import REPO_ROOT
from runner.guest.task_images import TaskImageBuild
from runner.lab import egress
from runner.lab.layout import DOCKER_HOST, GUEST, GUEST_PROXY_ADDRESS
from runner.lab.mirror import lab_mirror
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport
from runner.spec.lock import load_lock
from runner.spec.resolution import resolution_path
from tests.support.deploy_harness import local_host, yielded
from tests.support.vm_fixtures import VM_TEST_LAB, vm_lab  # noqa: F401  (fixture)

pytestmark = [pytest.mark.vm, pytest.mark.guest]

LAB = VM_TEST_LAB
LOCK = load_lock(REPO_ROOT / "locks" / "demo.toml")
# pyinfra's results table: every operation counted under "No Change".
ALL_UNCHANGED = re.compile(r"Grand total\s+(\d+)\s+-\s+-\s+\1\s*$", re.MULTILINE)


def deploy(*limit: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pyinfra", "-y", "inventory/local.py", "deploy.py", *limit],
        cwd=REPO_ROOT,
        env={**os.environ, "LAB": LAB, "LOCK": "locks/demo.toml"},
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def guest(vm_lab: LabState) -> Iterator[GuestTransport]:  # noqa: F811
    result = deploy("--limit", "lab_guests")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = load_lab_state(LabPaths.for_lab(LAB))
    with SshTransport.for_lab(state).connect(120) as transport:
        yield transport


def run(guest: GuestTransport, command: str, timeout: float = 600) -> str:
    return guest.check(command, timeout=timeout).stdout.strip()


def test_second_deploy_of_the_guest_changes_nothing_and_says_so(guest: GuestTransport) -> None:
    result = deploy("--limit", "lab_guests")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert ALL_UNCHANGED.search(output), output[-3000:]


def test_the_guest_cannot_reach_a_registry(guest: GuestTransport) -> None:
    reach = guest.exec("timeout 20 bash -c '</dev/tcp/registry.npmjs.org/443'", timeout=60)
    assert reach.exit_code != 0


# A task container's attempts: a TEST-NET address (the guest has no route beyond QEMU's subnet:
# the attempt fails in the guest's kernel, no packet is made), the proxy's address (let through),
# and a lookup (its resolver is not routable either).
_CONTAINER_ATTEMPTS = f"""
import socket
for address, port in [("192.0.2.1", 443), ({GUEST_PROXY_ADDRESS.split(":")[0]!r}, 8080)]:
    try:
        socket.create_connection((address, port), timeout=20).close()
        print(address, port, "connected")
    except OSError as error:
        print(address, port, error.errno)
try:
    socket.getaddrinfo("registry.npmjs.org", 443)
    print("lookup answered")
except OSError as error:
    print("lookup", type(error).__name__)
"""
_NETWORK_UNREACHABLE = 101  # ENETUNREACH


def test_egress_from_a_task_container_goes_nowhere_and_the_guests_lookup_is_recorded(
    guest: GuestTransport,
) -> None:
    """Measured here: the guest's only route is QEMU's subnet, so a container's connection to
    any other address fails at once in the guest (no packet, so nothing for the firewall to
    record), while the proxy's address connects; the guest's own lookup goes to its loopback
    resolver sink, which the firewall refuses and records."""
    assert run(guest, "systemctl is-enabled nftables.service") == "enabled"
    run(guest, egress.RESET_COMMAND)
    image = GUEST.task_image(LOCK.tasks.ids[0])
    said = run(guest, f"podman run --rm {image} python3 -c {shlex.quote(_CONTAINER_ATTEMPTS)}")
    print(said)
    assert f"192.0.2.1 443 {_NETWORK_UNREACHABLE}" in said, said
    assert f"{GUEST_PROXY_ADDRESS.split(':')[0]} 8080 connected" in said, said
    assert "lookup answered" not in said, said
    run(guest, "getent hosts registry.npmjs.org || true")  # the guest's own lookup
    listing = run(guest, egress.READ_COMMAND)
    refused = egress.parse_refused(listing)
    print([entry.label for entry in refused])
    where = {(entry.source, entry.proto, entry.address, entry.port) for entry in refused}
    assert ("guest", "udp", egress.GUEST_RESOLVER, 53) in where
    assert not any(entry.address == GUEST_PROXY_ADDRESS.split(":")[0] for entry in refused)


def test_no_timer_can_wake_during_a_benchmark(guest: GuestTransport) -> None:
    # Every timer unit the guest has is masked (images/configure.py), none loaded as active.
    shipped = run(guest, "ls /usr/lib/systemd/system/*.timer | xargs -n1 basename").split()
    assert "systemd-tmpfiles-clean.timer" in shipped
    states = run(guest, f"systemctl is-enabled {' '.join(shipped)} || true").split()
    assert states == ["masked"] * len(shipped), dict(zip(shipped, states, strict=False))
    assert run(guest, "systemctl list-units --no-legend --plain --type=timer --state=active") == ""


def test_runtime_and_tool_versions_equal_the_lock(guest: GuestTransport) -> None:
    assert run(guest, f"{GUEST.runtime_bin('node')} --version") == f"v{LOCK.tools.node}"
    assert run(guest, f"{GUEST.runtime_bin('bun')} --version") == LOCK.tools.bun
    assert run(guest, f"{GUEST.harbor} --version") == LOCK.tools.harbor
    assert run(guest, "podman --version") == f"podman version {LOCK.tools.podman}"


@pytest.mark.parametrize("harness", LOCK.harnesses, ids=lambda harness: harness.id)
def test_each_harness_runs_at_its_pinned_version(guest: GuestTransport, harness) -> None:
    node_bin = GUEST.runtime_bin("node").parent
    command = GUEST.harness_command(harness.id, harness.agent)
    # pi --version took 39 s in the arm64 guest (FIELD-NOTES): under TCG, give it room.
    version = run(guest, f"PATH={node_bin}:$PATH {command} --version", timeout=900)
    assert version == harness.package.version


def test_the_demo_package_is_in_its_harness_tree(guest: GuestTransport) -> None:
    tree = GUEST.harness_tree("pi-openpi")
    manifest = run(guest, f"cat {tree}/node_modules/@tt-a1i/openpi/package.json")
    assert '"@tt-a1i/openpi"' in manifest and '"extensions"' in manifest


def test_the_runner_agents_import_in_harbors_venv(guest: GuestTransport) -> None:
    python = GUEST.harbor_venv / "bin" / "python"
    found = run(guest, f"{python} -c 'import runner.guest.harbor_agents as a; print(a.PiAgent)'")
    assert "runner.guest.harbor_agents.PiAgent" in found


def test_podman_answers_on_the_docker_socket(guest: GuestTransport) -> None:
    assert run(guest, "systemctl is-enabled podman.socket") == "enabled"
    assert run(guest, f"DOCKER_HOST={DOCKER_HOST} docker version --format '{{{{.Server.Version}}}}'"
               ) == LOCK.tools.podman  # fmt: skip


@pytest.mark.parametrize("task", LOCK.tasks.ids)
def test_each_task_image_is_built_and_its_container_runs_the_frozen_harness(
    guest: GuestTransport, task: str
) -> None:
    image = GUEST.task_image(task)
    parents = run(guest, f"podman image tree {image}")
    assert "localhost/base:1" in parents or "bench-base" in parents, parents
    node = GUEST.image_artifacts.runtime_dir("node", LOCK.tools.node) / "bin" / "node"
    pi = GUEST.image_artifacts.harness_tree("pi-openpi") / "node_modules" / ".bin" / "pi"
    check = (
        "python3 -c 'import sqlite3, asyncio; print(42)' && git --version "
        f"&& {node} --version && test -x {pi}"
    )
    binds = GUEST.podman_volumes
    out = run(
        guest, f"podman run --rm --network none {binds} {image} bash -c {shlex.quote(check)}", 600
    )
    assert out.splitlines()[0] == "42"
    assert out.splitlines()[-1] == f"v{LOCK.tools.node}"


# Two tasks whose builds fail the ways a researcher's first task does: apt asks the lab's mirror
# for a package the frozen set lacks, and a RUN step fails on its own.
BROKEN_BUILDS = {
    "needs-unfrozen-deb": "FROM bench-base\nRUN apt-get update && apt-get install -y no-such-x\n",
    "fails-its-run-step": "FROM bench-base\nRUN echo building && ls /no/such/dir\n",
}


def _commands_of(operation: Any, **arguments: Any) -> list[str]:
    """The shell commands the deploy's own operation yields for an image not yet built."""
    host = local_host({})
    host.get_fact = lambda fact, **_kwargs: ""  # type: ignore[method-assign,assignment]
    return [
        str(command)
        for command in yielded(host, operation, **arguments)
        if isinstance(command, StringCommand | str)
    ]


def test_every_broken_task_build_is_tried_and_all_are_named_in_one_table(
    guest: GuestTransport,
) -> None:
    mirror = guest_ops.Mirror(LAB, str(resolution_path(REPO_ROOT / "locks" / "demo.toml", LOCK)))
    images: list[TaskImageBuild] = []
    with lab_mirror(mirror.lab, Path(mirror.resolution_file)):
        for task, dockerfile in BROKEN_BUILDS.items():
            context = f"/tmp/broken-builds/{task}"
            run(
                guest,
                f"mkdir -p {context} && printf %s {shlex.quote(dockerfile)} > {context}/Dockerfile",
            )
            build = TaskImageBuild(
                task=task, image=f"localhost/broken-{task}:test", inputs_digest="sha256:broken",
                build_timeout_sec=300.0,
            )  # fmt: skip
            images.append(build)
            for command in _commands_of(
                guest_ops.task_image, task=task, image=build.image, context=context,
                digest=build.inputs_digest, timeout_seconds=build.build_timeout_sec,
                mirror=mirror,
            ):  # fmt: skip
                run(guest, command, timeout=600)
        (report,) = _commands_of(guest_ops.task_images_built, images=tuple(images))
        result = guest.exec(report, timeout=120)
    run(guest, "rm -rf /tmp/broken-builds; rm -f /var/lib/bench/builds/needs-unfrozen-deb.* "
               "/var/lib/bench/builds/fails-its-run-step.*")  # fmt: skip
    assert result.exit_code == 1, result.stdout + result.stderr
    table = result.stderr.splitlines()
    assert table[0] == "2 of 2 task images did not build:"
    rows = {line.split()[0]: line for line in table[2:4]}
    assert "E: Unable to locate package no-such-x" in rows["needs-unfrozen-deb"]
    assert "No such file or directory" in rows["fails-its-run-step"]
    assert "the lab's frozen package set has no no-such-x" in table[4]
