"""Image build speed: a cached build (seconds) and, with --cold, a cold one (minutes).

    python bench/image_build.py                 # cached: the default store's entry for the lock
    python bench/image_build.py --cold          # also a cold build into a fresh, temporary store,
                                                # then compares its files with the cached entry

The cold build doubles as the reproducibility check: same lock, same mirror state, a second
build from nothing must give the same sha256 for root.qcow2, vmlinuz and initrd.img. Its
phases (each build stage and each of mmdebstrap's own steps) are printed with their seconds.
Target (under qemu-user on a 2-core host): cold <= 600 s; cached: a few seconds.
"""

from __future__ import annotations

import itertools
import re
import resource
import shutil
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console

from images.manifest import ARTIFACT_NAMES, ImageManifest
from images.paths import default_store_root
from images.recipe import ImageInputs, input_hash
from images.store import ImageStore
from runner.core.roots import REPO_ROOT
from runner.spec.lock import load_lock

COLD_TARGET_SECONDS = 600
# A build.log line that starts a phase: a build stage ("=== configure: ...") or one of
# mmdebstrap's own steps ("I: installing remaining packages inside the chroot..."), which start
# with a word, unlike a package script's ("I: /vmlinuz is now a symlink to ...").
_PHASE_START = re.compile(r"^\[\s*([\d.]+)s\] (?:=== |I: )([a-z].*)$")


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


def phase_seconds(build_log: str) -> list[tuple[str, float]]:
    """(phase, seconds until the next phase started) for each phase of a build.log."""
    starts = [(float(m[1]), m[2]) for m in map(_PHASE_START.match, build_log.splitlines()) if m]
    return [(name, end - start) for (start, name), (end, _) in itertools.pairwise(starts)]


def _print_phases(build_log: Path) -> None:
    for name, seconds in phase_seconds(build_log.read_text()):
        if seconds >= 1:
            click.echo(f"  {seconds:6.1f} s  {name[:80]}")


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
            cold_store = ImageStore(scratch, console)
            cold_seconds, cold_manifest = _timed_build(cold_store, lock_path)
            _print_phases(cold_store.entry(cold_manifest.input_hash).build_log)
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
