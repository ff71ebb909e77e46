"""``runner resolve LOCK``: fetch every artifact the guest needs and write the resolution.

Exit codes: 0 resolved (or, with --check, matching); 1 an artifact its source does not have,
a download or digest failure, or a --check mismatch; 2 bad input (a malformed lock or
resolution file).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click
from rich.console import Console

from runner.artifacts.resolver import resolve_lock
from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.core.roots import REPO_ROOT
from runner.spec.lock import load_lock
from runner.spec.resolution import load_resolution, resolution_path


@click.command("resolve")
@click.argument("lock_path", metavar="LOCK", type=click.Path(path_type=Path))
@click.option(
    "--check",
    is_flag=True,
    help="Resolve again and compare with the resolution file; refuse on any difference "
    "(the file is left as it is).",
)
def resolve_command(lock_path: Path, check: bool) -> None:
    """Resolve LOCK's artifacts for its guest into the host cache; write LOCK's resolution."""
    lock = load_lock(lock_path)
    path = resolution_path(lock_path, lock)
    recorded = load_resolution(path, lock) if check else None
    paths = CachePaths.default()
    started = time.monotonic()
    resolved = asyncio.run(resolve_lock(lock, REPO_ROOT, paths, Console(stderr=True)))
    seconds = time.monotonic() - started
    artifacts = resolved.resolution.artifacts
    click.echo(f"{resolved.report.summary()} ({seconds:.1f} s; store {paths.artifacts})")
    if recorded is not None:
        difference = recorded.artifact_difference(resolved.resolution)
        if difference is not None:
            raise RunnerError(f"{path}: differs from a fresh resolution: {difference}")
        click.echo(f"{path}: matches a fresh resolution ({len(artifacts)} artifacts)")
        return
    write_model(path, resolved.resolution)
    click.echo(
        f"{len(artifacts)} artifacts ({resolved.total_bytes / 1e6:.1f} MB) for "
        f"{lock.guest.arch}, resolution {resolved.resolution.digest} written to {path}"
    )
