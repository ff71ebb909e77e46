"""Image build speed: a cached build (seconds) and, with --cold, a cold one (minutes).

    python bench/image_build.py                 # cached: the default store's entry for the lock
    python bench/image_build.py --cold          # also a cold build into a fresh, temporary store,
                                                # then compares its files with the cached entry

The cold build doubles as the reproducibility check: same lock, same mirror state, a second
build from nothing must give the same sha256 for root.qcow2, vmlinuz and initrd.img.
Target (under qemu-user on a 2-core host): cold <= 600 s; cached: a few seconds.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console

from images.manifest import ARTIFACT_NAMES, ImageManifest
from images.paths import REPO_ROOT, default_store_root
from images.recipe import ImageInputs, input_hash
from images.store import ImageStore
from runner.spec.lock import load_lock

COLD_TARGET_SECONDS = 600


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_build(store: ImageStore, lock: Path) -> tuple[float, ImageManifest]:
    """Wall seconds of one build; also prints the CPU seconds of its tools, which unlike the
    wall time do not grow when other jobs (VMs under TCG) share the 2 cores."""
    started, cpu_started = time.monotonic(), _children_cpu_seconds()
    manifest = store.build(load_lock(lock).guest)
    wall = time.monotonic() - started
    click.echo(f"  tools' cpu_seconds={_children_cpu_seconds() - cpu_started:.1f}")
    return wall, manifest


@click.command()
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(exists=True, path_type=Path),
    default=REPO_ROOT / "locks" / "demo.toml",
    show_default=True,
)
@click.option("--cold", is_flag=True, help="Also build from nothing (takes ~10 minutes).")
@click.option("--keep", is_flag=True, help="Keep the cold build's temporary store.")
def main(lock_path: Path, cold: bool, keep: bool) -> None:
    console = Console(stderr=True, soft_wrap=True)
    cached_store = ImageStore(default_store_root(), console)
    if cold:
        scratch = Path(tempfile.mkdtemp(prefix="bench-images-", dir=default_store_root().parent))
        try:
            cold_seconds, cold_manifest = _timed_build(ImageStore(scratch, console), lock_path)
            verdict = "within" if cold_seconds <= COLD_TARGET_SECONDS else "OVER"
            click.echo(
                f"cold_seconds={cold_seconds:.1f} ({verdict} the {COLD_TARGET_SECONDS} s target)"
            )
        finally:
            if keep:
                click.echo(f"cold store kept: {scratch}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
    wanted = input_hash(ImageInputs.from_guest(load_lock(lock_path).guest))
    if cached_store.find(wanted) is None:
        click.echo("no cached entry yet: the 'cached' build below is a cold one")
    cached_seconds, manifest = _timed_build(cached_store, lock_path)
    click.echo(f"cached_seconds={cached_seconds:.1f}")
    if cold:
        differing = [n for n in ARTIFACT_NAMES if cold_manifest.files[n] != manifest.files[n]]
        for name in ARTIFACT_NAMES:
            click.echo(f"{name}: cached {manifest.files[name]} cold {cold_manifest.files[name]}")
        click.echo("reproducible=" + ("yes" if not differing else "no: " + ", ".join(differing)))


if __name__ == "__main__":
    main()
