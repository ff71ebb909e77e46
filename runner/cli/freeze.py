"""``runner freeze [--lab NAME] [--lock LOCK]``: record the guest's state and save it."""

from __future__ import annotations

import time
from pathlib import Path

import click

from runner.cli.options import lab_option
from runner.freeze.manifest import default_scope
from runner.freeze.paths import FreezePaths
from runner.freeze.record import freeze_lab


@click.command("freeze")
@lab_option
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(path_type=Path),
    help="The lock the lab must have been deployed for (default: the lab's own).",
)
def freeze_command(lab: str, lock_path: Path | None) -> None:
    """Record the guest's state (its whole disk, read on the host: every path, every package
    file against its package's digest; its live state: kernel, modules, sysctl, mounts, nftables,
    units, processes, accounts, Podman images and containers, listening ports) and save the
    running guest to reset to."""
    started = time.monotonic()
    frozen = freeze_lab(lab, default_scope(), lock_path)
    state = frozen.manifest.state
    disk = state.disk
    click.echo(f"packages      {len(state.packages)}")
    click.echo(
        f"disk          {disk.paths} paths ({disk.regular_files} files), {disk.package_files} "
        f"files of {disk.packages} packages checked against their digests, "
        f"{disk.package_deviations} differing at the freeze"
    )
    click.echo(f"live state    {', '.join(f'{k} {len(v)}' for k, v in state.live.items())}")
    for task, digest in sorted(state.tasks.items()):
        click.echo(f"task          {task} {digest}")
    for derivation in frozen.manifest.tasks:
        status = "derived" if derivation.derived else "as upstream"
        click.echo(
            f"task tree     {derivation.id} {status}: {derivation.upstream_tree} -> "
            f"{derivation.derived_tree}"
        )
        for change in derivation.changes:
            click.echo(f"                {change}")
    for score in frozen.manifest.oracle:
        judged = (
            ""
            if score.judges
            else (
                f" ({score.tolerated or 'timing-sensitive under emulation'}: this lab cannot "
                "judge it; "
                + (f"Harbor: {score.harbor_said}; " if score.harbor_said else "")
                + f"verifier: {score.verifier_last_lines})"
            )
        )
        click.echo(
            f"oracle        {score.task} reward {score.reward:g} ({score.seconds:.0f} s){judged}"
        )
    click.echo(f"images        {len(state.images)}")
    click.echo(f"listening     {' '.join(s.label for s in state.listening)}")
    click.echo(f"kernel        {state.kernel}")
    steps = ", ".join(f"{step} {seconds:.1f}" for step, seconds in frozen.seconds.items())
    click.echo(f"steps (s)     {steps}")
    click.echo(f"manifest      {FreezePaths.for_lab(lab).manifest}")
    click.echo(f"environment   {frozen.manifest.environment_fingerprint}")
    click.echo(f"saved state   {frozen.saved.memory_image}")
    click.echo(f"freeze sha256: {frozen.manifest.sha256} ({time.monotonic() - started:.1f} s)")
