"""``python -m images build LOCK [--store DIR]``: the image for a lock, from the store or built.

The last line printed (on stdout) is the manifest path, for scripts to pick up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from images.store import ImageStore
from runner.core.errors import RunnerError
from runner.spec.lock import load_lock


@click.group()
def main() -> None:
    """Reproducible Debian base images for the benchmark VM."""


@main.command()
@click.argument("lock_path", metavar="LOCK", type=click.Path(path_type=Path))
@click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Image store directory [default: $FROZEN_BENCH_CACHE/images or <repo>/.cache/images].",
)
def build(lock_path: Path, store: Path | None) -> None:
    """Build the image for LOCK's [guest] section, or return the cached one."""
    console = Console(stderr=True, soft_wrap=True)
    try:
        image_store = ImageStore(store, console)
        manifest = image_store.build(load_lock(lock_path).guest)
    except RunnerError as error:
        console.print(f"error: {error}", markup=False, highlight=False)
        sys.exit(error.exit_code)
    click.echo(image_store.entry(manifest.input_hash).manifest)


if __name__ == "__main__":
    main()
