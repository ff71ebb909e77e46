"""``runner execute [LOCK] [--run-dir DIR]``."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console

from runner.cli.options import lab_option
from runner.fleet.controller import execute_fleet
from runner.records.paths import RunPaths
from runner.run.execute import ExecuteOptions, execute
from runner.spec.fleet import load_fleet


@click.command("execute")
@click.argument("lock_path", metavar="[LOCK]", required=False, type=click.Path(path_type=Path))
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The run directory; an existing one is resumed (default: runs/<lock>-<UTC time>).",
)
@click.option(
    "--reset/--no-reset",
    default=True,
    show_default=True,
    help="Reset the guest to its frozen snapshot before every cell (off: verify only at start).",
)
@click.option(
    "--withhold-from-mirror",
    "withhold",
    multiple=True,
    hidden=True,
    help="A fault for the tests: the lab's package mirror serves the frozen set without NAME.",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Spread the batches over this fleet's hosts through Temporal (a lock whose placement "
    "is batch-per-host; runner.fleet). Without it: one lab, strictly serial.",
)
@lab_option
def execute_command(
    lock_path: Path | None,
    run_dir: Path | None,
    reset: bool,
    withhold: tuple[str, ...],
    fleet_path: Path | None,
    lab: str,
) -> None:
    """Run the lock's frozen schedule in the lab's frozen guest, one cell at a time.

    Exit code 0 when the receipt is ``completed`` or ``completed_with_indeterminate``, 1 when it
    is ``failed_closed``. A run that stops early still writes its receipt (failed closed) and
    exits with one line: 2 when the input was at fault (a lock or lab that do not agree), else 1."""
    if run_dir is None:
        lock_path = lock_path or Path("locks/demo.toml")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        run_dir = Path("runs") / f"{lock_path.stem}-{stamp}"
    console = Console()
    if fleet_path is not None:
        receipt = execute_fleet(lock_path, run_dir, load_fleet(fleet_path), console)
    else:
        receipt = execute(ExecuteOptions(lock_path, run_dir, lab, reset, withhold), console)
    paths = RunPaths(run_dir)
    console.print(f"status: {receipt.status}")
    for reason in receipt.reasons:
        console.print(f"  failed closed: {reason}")
    console.print(f"report: {paths.report_md} {paths.report_html}  receipt: {paths.receipt}")
    if receipt.status == "failed_closed":
        sys.exit(1)
