"""Operations on the hypervisor host: daemons, binfmt handlers, device access."""

from __future__ import annotations

from collections.abc import Generator

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import Directory

from deploy.facts.host import BINFMT_DIR, BinfmtHandler, DaemonPids, DeviceAccess


@operation()
def daemon(daemon_name: str) -> Generator[StringCommand, None, None]:
    """
    The daemon ``daemon_name`` runs: ``systemctl start`` under systemd, else ``NAME -d``
    (libvirtd and virtlogd daemonize themselves; containers and CI hosts often lack systemd).

    + daemon_name: the daemon's executable name
    """
    pids = host.get_fact(DaemonPids, process=daemon_name)
    if pids:
        host.noop(f"{daemon_name} already running (pid {pids[0]})")
    elif host.get_fact(Directory, path="/run/systemd/system"):
        yield StringCommand("systemctl", "start", QuoteString(daemon_name))
    else:
        yield StringCommand(QuoteString(daemon_name), "-d")


@operation(is_idempotent=False)
def daemon_restarted(daemon_name: str) -> Generator[StringCommand, None, None]:
    """
    The daemon ``daemon_name`` is restarted (its configuration changed: pass ``_if``).

    + daemon_name: the daemon's executable name
    """
    if host.get_fact(Directory, path="/run/systemd/system"):
        yield StringCommand("systemctl", "restart", QuoteString(daemon_name))
        return
    for pid in host.get_fact(DaemonPids, process=daemon_name):
        yield StringCommand(f"kill {pid} && while kill -0 {pid} 2>/dev/null; do sleep 0.2; done")
    yield StringCommand(QuoteString(daemon_name), "-d")


@operation()
def binfmt(handler: str) -> Generator[StringCommand, None, None]:
    """
    The binfmt_misc ``handler`` is registered and enabled (foreign binaries run under qemu).

    + handler: handler name, e.g. ``qemu-aarch64`` (from qemu-user-static)
    """
    if host.get_fact(BinfmtHandler, handler=handler) == "enabled":
        host.noop(f"binfmt handler {handler} already enabled")
        return
    mount = ("mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR)
    yield StringCommand("mountpoint", "-q", BINFMT_DIR, "||", *mount)
    yield StringCommand("update-binfmts", "--enable", QuoteString(handler))


@operation()
def device_access(path: str, group: str, mode: str) -> Generator[StringCommand, None, None]:
    """
    A device node belongs to ``group`` with ``mode`` (e.g. /dev/kvm for libvirt's qemu user).

    + path: the device node
    + group: owning group
    + mode: octal mode, e.g. "660"
    """
    access = host.get_fact(DeviceAccess, path=path)
    if not access["group"]:
        raise OperationError(f"{path} does not exist")
    if access["group"] != group:
        yield StringCommand("chgrp", QuoteString(group), QuoteString(path))
    if access["mode"] != mode:
        yield StringCommand("chmod", mode, QuoteString(path))
    if access == {"group": group, "mode": mode}:
        host.noop(f"{path} already {group} {mode}")
