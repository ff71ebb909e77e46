"""The ``runner`` command: wires one module per verb; errors become one line and an exit code."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import click

from runner.cli.archive import archive_command
from runner.cli.check_archive import check_archive_command
from runner.cli.execute import execute_command
from runner.cli.fleet import fleet_command
from runner.cli.freeze import freeze_command
from runner.cli.rebuild import rebuild_command
from runner.cli.report import report_command
from runner.cli.reset import reset_command
from runner.cli.resolve import resolve_command
from runner.cli.schedule import schedule_command
from runner.cli.status import status_command
from runner.cli.teardown import teardown_command
from runner.cli.verify import verify_command
from runner.core.errors import RunnerError, terminal_safe
from runner.core.host_lock import HOST_LOCK, UNLOCKED_HOST_ENV, host_difference, unlocked_host
from runner.core.roots import REPO_ROOT
from runner.core.signals import take_sigterm


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Provision a frozen benchmark VM and run a frozen schedule of coding-agent cells in it."""


cli.add_command(schedule_command)
cli.add_command(report_command)
cli.add_command(teardown_command)
cli.add_command(rebuild_command)
cli.add_command(status_command)
cli.add_command(resolve_command)
cli.add_command(freeze_command)
cli.add_command(verify_command)
cli.add_command(reset_command)
cli.add_command(execute_command)
cli.add_command(archive_command)
cli.add_command(check_archive_command)
cli.add_command(fleet_command)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the runner was: it unwinds as Ctrl-C does (the cell's proxy record
    and the run's receipt are written; finished cells stay in the ledger)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


# The venv differs from the host lock: the judge is not the one the lock froze.
UNLOCKED_HOST_EXIT = 3


def check_host_lock() -> None:
    """Refuse, in one line naming the package, a venv that differs from the host lock, unless
    the operator sets FROZEN_BENCH_UNLOCKED_HOST=1 (then said on stderr, and in the receipt)."""
    difference = host_difference()
    if difference is None:
        return
    lock = HOST_LOCK.relative_to(REPO_ROOT)
    if unlocked_host():
        click.echo(
            f"runner: {UNLOCKED_HOST_ENV}=1: host venv differs from {lock}: {difference} "
            "(the receipt records it)",
            err=True,
        )
        return
    click.echo(
        f"runner: host venv differs from {lock}: {difference} (bash scripts/setup-host.sh "
        f"installs the lock; {UNLOCKED_HOST_ENV}=1 runs on it anyway, recorded in the receipt)",
        err=True,
    )
    sys.exit(UNLOCKED_HOST_EXIT)


def main() -> None:
    # Even when started with SIGTERM ignored (runner/core/signals.py): a run in CI once went on
    # for two more cells after its SIGTERM.
    take_sigterm(_raise_terminated)
    check_host_lock()
    try:
        cli.main(standalone_mode=False)
    except RunnerError as error:
        click.echo(f"runner: error: {terminal_safe(str(error), newlines=True)}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort as abort:  # click turns a KeyboardInterrupt into Abort
        if isinstance(abort.__cause__, Terminated):
            click.echo("runner: stopped by SIGTERM; what finished is recorded", err=True)
            sys.exit(128 + signal.SIGTERM)
        click.echo("runner: aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
