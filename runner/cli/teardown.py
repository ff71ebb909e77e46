"""``runner teardown [--lab NAME]``: remove the lab's VM, volumes, console log and state."""

from __future__ import annotations

import time

import click

from runner.cli.options import lab_option
from runner.lab.state import LabPaths
from runner.lab.teardown import teardown_lab


@click.command("teardown")
@lab_option
@click.option(
    "--uri",
    default=None,
    help="libvirt URI, when the lab's lab.json is gone (default: lab.json's, else qemu:///system).",
)
def teardown_command(lab: str, uri: str | None) -> None:
    """Remove lab LAB completely; a second teardown has nothing to do."""
    started = time.monotonic()
    removed = teardown_lab(lab, LabPaths.for_lab(lab), uri)
    for line in removed:
        click.echo(line)
    if not removed:
        click.echo(f"lab {lab}: nothing to do")
    click.echo(f"teardown: {time.monotonic() - started:.1f} s")
