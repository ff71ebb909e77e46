"""The guest's SSH host key: read once from its serial console, pinned in lab.json, checked by
every client.

Why the console: the key must reach the host through a channel that is not the SSH connection
it is to check. The guest makes its key pair at its first boot (sshd-keygen.service) and, at
every boot before sshd starts, prints the public half as one line ``lab.host_key=<type> <base64>``
to its serial console (images/guest/usr/local/sbin/lab-host-key); libvirt writes that console to
the lab's console.log, a file of the lab's pool, which the deploy reads through libvirt (so a
remote hypervisor's too). The private key never leaves the guest: handing in a host-made key
pair would put a secret where the guest's containers could read it (its kernel command line is
/proc/cmdline to them). A reset or revert restores a disk made after that first boot, so it
keeps the key; only ``runner rebuild`` (a new overlay, a new lab directory) makes a new one.

The pin is ``LabState.ssh_host_key``; ``known_hosts`` in the lab directory is written from it
for the OpenSSH-style clients (pyinfra's connector, Ansible), never the other way round.
"""

from __future__ import annotations

import base64
import binascii
import re

import paramiko

from runner.core.errors import RunnerError
from runner.core.files import write_atomic, write_model
from runner.lab.state import LabPaths, LabState

_CONSOLE_LINE = re.compile(r"lab\.host_key=(ssh-ed25519 [A-Za-z0-9+/]+={0,2})\r?$", re.MULTILINE)


class HostKeyError(RunnerError):
    """The guest's host key is not pinned, or the guest offered another one."""


def parsed_key(line: str) -> paramiko.PKey | None:
    """``ssh-ed25519 <base64>`` as a key, None when it is not one (a console line cut short)."""
    kind, _, encoded = line.partition(" ")
    if kind != "ssh-ed25519":
        return None
    try:
        return paramiko.Ed25519Key(data=base64.b64decode(encoded, validate=True))
    except (binascii.Error, paramiko.SSHException):
        return None


def host_key_in_console(text: str) -> str | None:
    """The last well-formed ``lab.host_key=`` line of a console log: the latest boot's (a log
    libvirt appends to holds every boot's). A line the kernel's own output broke is skipped."""
    for line in reversed(_CONSOLE_LINE.findall(text)):
        if parsed_key(line) is not None:
            return str(line)
    return None


def known_hosts_name(lab: LabState) -> str:
    """How OpenSSH and Paramiko name the guest's address in known_hosts (port 22 bare)."""
    return lab.ssh_host if lab.ssh_port == 22 else f"[{lab.ssh_host}]:{lab.ssh_port}"


def pinned_key(lab: LabState) -> paramiko.PKey:
    """The key lab.json pins; ``HostKeyError`` when it pins none."""
    key = parsed_key(lab.ssh_host_key or "")
    if key is None:
        raise HostKeyError(
            f"lab {lab.lab}: lab.json pins no SSH host key for its guest (a lab deployed before"
            " keys were pinned): run `runner rebuild` for it"
        )
    return key


def refused(lab: LabState, offered: paramiko.PKey) -> HostKeyError:
    """The one line for a guest that offered a key other than the pinned one."""
    return HostKeyError(
        f"lab {lab.lab}: the guest at {lab.ssh_host}:{lab.ssh_port} offered SSH host key "
        f"{offered.fingerprint}, not the {pinned_key(lab).fingerprint} pinned in lab.json: "
        "refused (`runner rebuild` if the guest was remade)"
    )


def write_known_hosts(lab: LabState) -> LabPaths:
    """The lab's known_hosts, written from lab.json's pin (for pyinfra's connector, Ansible)."""
    paths = LabPaths.for_lab(lab.lab)
    key = pinned_key(lab)
    line = f"{known_hosts_name(lab)} {key.get_name()} {key.get_base64()}\n"
    write_atomic(paths.known_hosts, line.encode())
    return paths


def pin_host_key(lab: LabState, console: str) -> LabState:
    """``lab`` with the key its guest printed on ``console`` pinned (lab.json and known_hosts
    written); unchanged when it pins one already (captured when the lab was made)."""
    if lab.ssh_host_key is not None:
        return lab
    line = host_key_in_console(console)
    if line is None:
        raise HostKeyError(
            f"lab {lab.lab}: its guest answers SSH but printed no lab.host_key= line on its"
            f" console ({lab.console_log}): is its image older than the pinned host keys?"
            " `runner rebuild` it"
        )
    pinned = LabState.model_validate({**lab.model_dump(), "ssh_host_key": line})
    write_model(LabPaths.for_lab(lab.lab).state, pinned)
    write_known_hosts(pinned)
    return pinned
