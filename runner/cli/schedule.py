"""``runner schedule LOCK``: print the ordered cells and write ``schedule.json``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from runner.core.canonical import canonical_json
from runner.core.files import write_atomic
from runner.records.schedule import build_schedule, is_balanced
from runner.spec.lock import load_lock


@click.command("schedule")
@click.argument("lock_path", metavar="LOCK", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("schedule.json"),
    show_default=True,
    help="Where to write the schedule (its bytes are the canonical JSON that is hashed).",
)
def schedule_command(lock_path: Path, out: Path) -> None:
    """Derive the ordered cell list of LOCK (one batch per model, Latin-square harness order)."""
    lock = load_lock(lock_path)
    schedule = build_schedule(lock)
    table = Table(title=f"schedule of {lock.name}")
    for column in ("#", "cell id", "batch", "task", "repeat", "harness"):
        table.add_column(column)
    for number, cell in enumerate(schedule.cells, start=1):
        table.add_row(str(number), cell.id, cell.batch, cell.task, str(cell.repeat), cell.harness)
    console = Console(soft_wrap=True)
    console.print(table)
    for batch in schedule.batches:
        balance = "balanced" if is_balanced(batch, len(lock.harnesses)) else "NOT balanced"
        console.print(
            f"batch {batch.id}: {len(batch.cells)} cells, harness positions {balance}, "
            f"lock fingerprint {batch.lock_fingerprint}"
        )
    write_atomic(out, canonical_json(schedule))
    console.print(f"{len(schedule.cells)} cells written to {out}")
    click.echo(f"schedule sha256: {schedule.sha256}")
