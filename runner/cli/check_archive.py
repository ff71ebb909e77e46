"""``runner check-archive FILE``: verify a run's archive offline; one verdict, exit 1 if broken."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runner.run.check_archive import ArchiveBroken, check_archive


@click.command("check-archive")
@click.argument(
    "archive", metavar="FILE", type=click.Path(path_type=Path, dir_okay=False, exists=True)
)
@click.option(
    "--key",
    "key_file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="the operator's public key as published; without it, the archive's own is trusted",
)
def check_archive_command(archive: Path, key_file: Path | None) -> None:
    """Check the signatures, the ledger's chain, every digest, every outcome against its trial,
    the credential scan, and that the receipt and report recompute from the run's files."""
    try:
        verdict = check_archive(archive, key_file.read_text() if key_file else None)
    except ArchiveBroken as broken:
        click.echo(f"archive BROKEN: {broken}")
        sys.exit(broken.exit_code)
    click.echo(verdict.line)
