"""Operations on the hypervisor host: Debian packages, daemons, binfmt handlers, device access."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory

from deploy.facts.host import BINFMT_DIR, BinfmtHandler, DaemonPids, DeviceAccess

# Two labs provisioned at once on one host (the test script deploys its labs side by side) must
# not meet on apt's own locks: `apt-get update` fails at once on a held lists lock, and
# DPkg::Lock::Timeout does not cover that lock (apt 2.6). Every apt run of ours takes this lock
# first (scripts/setup-host.sh too), waiting up to 15 minutes for another's install.
APT_LOCK = "/run/lock/frozen-bench-apt.lock"
APT_LOCK_WAIT_S = 900


@operation()
def packages_installed(packages: Sequence[str]) -> Generator[StringCommand, None, None]:
    """
    The Debian ``packages`` are installed. apt runs only when one is missing (the package lists
    are then updated first), under the host-wide apt lock of this project.

    + packages: Debian package names
    """
    installed = host.get_fact(DebPackages)
    missing = [name for name in packages if name not in installed]
    if not missing:
        host.noop(f"all {len(packages)} packages already installed")
        return
    apt_lock = ("flock", "-w", str(APT_LOCK_WAIT_S), APT_LOCK)
    locked = ("env", "DEBIAN_FRONTEND=noninteractive", *apt_lock)
    yield StringCommand(*locked, "apt-get", "update", "-qq")
    install = ("apt-get", "install", "-y", "-qq", "--no-install-recommends")
    yield StringCommand(*locked, *install, *(QuoteString(name) for name in missing))


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
