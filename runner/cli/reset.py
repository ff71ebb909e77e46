"""``runner reset [--lab NAME]``: return the guest to its frozen state."""

from __future__ import annotations

import click

from runner.cli.options import lab_option
from runner.freeze.reset import reset_lab


@click.command("reset")
@lab_option
def reset_command(lab: str) -> None:
    """Return the guest to the state of the last `runner freeze` (memory and disk: anything
    written since is gone), wait until its sshd answers, and set its clock."""
    times = reset_lab(lab)
    restore = times.restore
    click.echo(
        f"stop {restore.destroy_seconds:.2f} s, live layer {restore.live_layer_seconds:.2f} s, "
        f"restore {restore.restore_seconds:.2f} s, sshd banner {times.banner_seconds:.2f} s, "
        f"clock set over SSH {times.clock_seconds:.2f} s"
    )
    click.echo(
        f"reset to freeze {times.freeze_manifest_sha256}: SSH answering after "
        f"{times.answering_seconds:.2f} s, ready after {times.total_seconds:.2f} s"
    )
