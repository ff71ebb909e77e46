"""Facts and operations on the hypervisor host: output parsing and the commands yielded."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyinfra.api.host import Host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory

from deploy.facts.host import BinfmtHandler, DaemonPids, DeviceAccess
from deploy.operations import host as host_ops
from tests.support.deploy_harness import local_host as make_local_host
from tests.support.deploy_harness import yielded


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([], "absent"),
        (["enabled", "interpreter /usr/libexec/qemu"], "enabled"),
        (["disabled"], "disabled"),
    ],
)
def test_binfmt_handler_state(output: list[str], expected: str) -> None:
    assert BinfmtHandler().process(output) == expected


def test_daemon_pids_and_device_access_parse_their_commands_output() -> None:
    assert DaemonPids().process(["123", "456"]) == [123, 456]
    assert DeviceAccess().process(["kvm 660"]) == {"group": "kvm", "mode": "660"}


@pytest.fixture
def local_host() -> Host:
    return make_local_host({})


def commands(host: Host, op: Any, facts: dict[Any, Any], **args: Any) -> list[str]:
    """The commands ``op`` yields when the host's facts are ``facts``."""
    host.get_fact = lambda fact, **_: facts[fact]  # type: ignore[assignment,method-assign]
    return [str(command) for command in yielded(host, op, **args)]


@pytest.mark.parametrize(
    ("access", "expected"),
    [
        ({"group": "root", "mode": "600"}, ["chgrp kvm /dev/kvm", "chmod 660 /dev/kvm"]),
        ({"group": "kvm", "mode": "600"}, ["chmod 660 /dev/kvm"]),
        ({"group": "kvm", "mode": "660"}, []),
    ],
)
def test_device_access_yields_only_what_differs(
    local_host: Host, access: dict[str, str], expected: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        got = commands(
            local_host,
            host_ops.device_access,
            {DeviceAccess: access},
            path="/dev/kvm",
            group="kvm",
            mode="660",
        )
    assert got == expected
    assert ("/dev/kvm already kvm 660" in caplog.text) == (not expected)


def test_daemon_is_started_without_systemd_and_left_alone_when_running(local_host: Host) -> None:
    no_systemd = {DaemonPids: [], Directory: False}
    assert commands(local_host, host_ops.daemon, no_systemd, daemon_name="libvirtd") == [
        "libvirtd -d"
    ]
    with_systemd = {DaemonPids: [], Directory: {"mode": 755}}
    assert commands(local_host, host_ops.daemon, with_systemd, daemon_name="libvirtd") == [
        "systemctl start libvirtd"
    ]
    assert commands(local_host, host_ops.daemon, {DaemonPids: [42]}, daemon_name="libvirtd") == []


def test_restart_stops_the_running_daemon_then_starts_it(local_host: Host) -> None:
    no_systemd = {DaemonPids: [42], Directory: False}
    assert commands(local_host, host_ops.daemon_restarted, no_systemd, daemon_name="libvirtd") == [
        "kill 42 && while kill -0 42 2>/dev/null; do sleep 0.2; done",
        "libvirtd -d",
    ]
    with_systemd = {DaemonPids: [42], Directory: {"mode": 755}}
    assert commands(
        local_host, host_ops.daemon_restarted, with_systemd, daemon_name="libvirtd"
    ) == ["systemctl restart libvirtd"]


def test_packages_installed_runs_apt_only_for_what_is_missing_under_the_apt_lock(
    local_host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    wanted = ["socat", "qemu-utils", "libvirt-clients"]
    some_missing = {DebPackages: {"qemu-utils": ["1:7.2"], "bash": ["5.2"]}}
    got = commands(local_host, host_ops.packages_installed, some_missing, packages=wanted)
    locked = f"env DEBIAN_FRONTEND=noninteractive flock -w 900 {host_ops.APT_LOCK}"
    assert got == [
        f"{locked} apt-get update -qq",
        f"{locked} apt-get install -y -qq --no-install-recommends socat libvirt-clients",
    ]
    all_there = {DebPackages: {name: ["1"] for name in wanted}}
    with caplog.at_level(logging.DEBUG, logger="pyinfra"):
        assert commands(local_host, host_ops.packages_installed, all_there, packages=wanted) == []
    assert "all 3 packages already installed" in caplog.text
