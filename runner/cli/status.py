"""``runner status [--lab NAME]``: the lab's VM state, image, ports, acceleration, SSH."""

from __future__ import annotations

import click

from runner.cli.options import lab_option
from runner.core.errors import InputError
from runner.lab import libvirt as virt
from runner.lab.host_key import HostKeyError
from runner.lab.layout import GUEST_PROXY_ADDRESS
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import GuestError, guest_machine


@click.command("status")
@lab_option
def status_command(lab: str) -> None:
    """Show how lab LAB stands (from its lab.json, libvirt and one SSH attempt)."""
    paths = LabPaths.for_lab(lab)
    if not paths.state.exists():
        raise InputError(f"lab {lab}: not deployed (no {paths.state})")
    state = load_lab_state(paths)
    domain = virt.find_domain(virt.connect(state.libvirt_uri), state.domain_name)
    domain_state = "absent" if domain is None else virt.domain_state(domain)
    try:
        ssh = f"answers ({guest_machine(state)})"
    except (GuestError, HostKeyError) as error:
        ssh = f"does not answer: {error}"
    rows = (
        ("lab", state.lab),
        ("domain", f"{state.domain_name} on {state.libvirt_uri}: {domain_state}"),
        ("image", f"{state.image.input_hash} (root.qcow2 {state.image.root_sha256})"),
        ("acceleration", f"{state.acceleration.kind} ({state.acceleration.reason})"),
        ("ssh", f"{state.ssh_user}@{state.ssh_host}:{state.ssh_port} {ssh}"),
        ("proxy port", f"127.0.0.1:{state.proxy_port} (guest {GUEST_PROXY_ADDRESS})"),
        ("console log", state.console_log),
        ("lab state", str(paths.state)),
    )
    for key, value in rows:
        click.echo(f"{key:<13} {value}")
