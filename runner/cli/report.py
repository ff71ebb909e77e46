"""``runner report RUN_DIR``: write receipt.json, report.md, report.png and report.html."""

from __future__ import annotations

from pathlib import Path

import click

from runner.records.paths import RunPaths
from runner.report.signing import fingerprint_of
from runner.report.write import write_report


@click.command("report")
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
def report_command(run_dir: Path) -> None:
    """Derive the receipt and the report of a run directory from its files."""
    receipt = write_report(run_dir)
    paths = RunPaths(run_dir)
    click.echo(f"status: {receipt.status}")
    for reason in receipt.reasons:
        click.echo(f"  failed closed: {reason}")
    written = (paths.receipt, paths.receipt_signature, paths.report_md, paths.report_png)
    for path in (*written, paths.report_html):
        click.echo(f"wrote {path}")
    signer = receipt.signed_by or ""
    click.echo(f"receipt signed by {fingerprint_of(signer)} ({paths.receipt_public_key})")
