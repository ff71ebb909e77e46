"""``runner rebuild [--lab NAME]``: teardown, then the pyinfra deploy, each timed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import click

from runner.cli.options import lab_option
from runner.core.errors import RunnerError
from runner.core.roots import REPO_ROOT
from runner.lab.state import LabPaths
from runner.lab.teardown import teardown_lab


@click.command("rebuild")
@lab_option
@click.option(
    "--inventory",
    type=click.Path(path_type=Path),
    default=Path("inventory/local.py"),
    show_default=True,
    help="pyinfra inventory naming the hypervisor (relative to the repository).",
)
@click.option(
    "--limit",
    default=None,
    help="Only these inventory groups, e.g. 'hypervisors': the VM without the guest's software.",
)
def rebuild_command(lab: str, inventory: Path, limit: str | None) -> None:
    """Tear lab LAB down and deploy it again from the image (``pyinfra -y INVENTORY deploy.py``)."""
    started = time.monotonic()
    for line in teardown_lab(lab, LabPaths.for_lab(lab)):
        click.echo(line)
    teardown_seconds = time.monotonic() - started
    click.echo(f"teardown: {teardown_seconds:.1f} s")

    started = time.monotonic()
    limit_arguments = ["--limit", limit] if limit else []
    deploy = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *limit_arguments, str(inventory), "deploy.py"],
        cwd=REPO_ROOT,
        env={**os.environ, "LAB": lab},
        check=False,
    )
    deploy_seconds = time.monotonic() - started
    if deploy.returncode != 0:
        raise RunnerError(f"deploy failed (exit {deploy.returncode}) after {deploy_seconds:.1f} s")
    click.echo(f"deploy: {deploy_seconds:.1f} s")
    click.echo(f"rebuild: {teardown_seconds + deploy_seconds:.1f} s")
