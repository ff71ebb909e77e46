"""``runner archive RUN_DIR``: one reproducible, signed, credential-free tarball of a run."""

from __future__ import annotations

from pathlib import Path

import click

from runner.archive.tarball import DEFAULT_SIZE_LIMIT, write_archive
from runner.report.signing import fingerprint_of


@click.command("archive")
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="the tarball to write (default: RUN_DIR.tar.gz beside the run directory)",
)
@click.option(
    "--size-limit",
    type=click.IntRange(min=0),
    default=DEFAULT_SIZE_LIMIT,
    show_default=True,
    help="bytes; a larger file is kept by digest only, named in the manifest",
)
def archive_command(run_dir: Path, out: Path | None, size_limit: int) -> None:
    """Archive a finished run for a reviewer (refused if the scan of its bytes finds a secret)."""
    target = out or run_dir.parent / f"{run_dir.name}.tar.gz"
    manifest = write_archive(run_dir, target, size_limit)
    digest_only = [entry.path for entry in manifest.files if not entry.kept]
    click.echo(f"wrote {target}: {len(manifest.files)} files, {target.stat().st_size} bytes")
    for path in digest_only:
        click.echo(f"  kept by digest only (over {size_limit} bytes): {path}")
    click.echo(f"signed by {fingerprint_of(manifest.signed_by)} ({manifest.signed_by})")
