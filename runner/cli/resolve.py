"""``runner resolve LOCK``: fetch exactly what LOCK's committed resolution records.

The resolution file is authoritative: ``runner resolve LOCK`` fetches its artifacts (URL, size
and sha256 as recorded) into the host cache and never asks a resolver or rewrites the file; a
resolution that does not cover the lock any more is refused. ``--update`` resolves again from
the recorded pins, as a lockfile tool does: npm starts from each harness tree's lockfile, pip
holds each wheel at its version by a constraint while the lock still allows it, so only what
the lock's change needs moves (``--upgrade``: every npm and wheel pin afresh; Debian packages
are always the suite's current ones). It writes the resolution (and the harness trees'
lockfiles beside it) and prints what changed, package by package. ``--lab LAB`` (a provisioned
lab of this lock) builds each task's image once against the recording mirror
(runner.artifacts.task_builds), runs its oracle on it, and records what each build and trial
took beyond the frozen set under that task into the resolution as it stands (nothing else is
resolved again; with ``--update``, into the updated one), so every later build and cell is
served it offline (``--task ID``: only those tasks). What earlier recordings took is kept by a
plain ``--update``. ``--check`` resolves afresh (from no pins) and compares, leaving the file
as it is.

Exit codes: 0 fetched (or updated, or with --check, matching); 1 an artifact its source does
not have, a download or digest that differs from the record, or a --check mismatch; 2 bad
input (a malformed lock or resolution file, or both --update and --check).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click
from rich.console import Console

from runner.artifacts.recorded import fetch_recorded
from runner.artifacts.recording import carried_records, merge_recorded
from runner.artifacts.resolver import ALL_SECTIONS, KeptPins, Section, resolve_lock
from runner.artifacts.task_builds import lab_guest, record_task_builds, suite_packages
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.errors import InputError, RunnerError
from runner.core.files import read_model, write_atomic, write_model
from runner.core.roots import REPO_ROOT
from runner.lab.task_trees import task_derivations
from runner.spec.lock import Lock, load_lock
from runner.spec.resolution import (
    RecordedContent,
    Resolution,
    changes,
    load_resolution,
    lockfile_path,
    lockfiles_dir,
    resolution_path,
)


@click.command("resolve")
@click.argument("lock_path", metavar="LOCK", type=click.Path(path_type=Path))
@click.option(
    "--update",
    is_flag=True,
    help="Resolve again from the sources, starting from the recorded pins (each harness "
    "tree's lockfile, each wheel's version): only what the lock now needs moved moves. Writes "
    "the resolution and prints what changed.",
)
@click.option(
    "--upgrade",
    is_flag=True,
    help="With --update: choose every npm and wheel pin afresh (their newest the lock allows).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Resolve afresh and compare with the resolution file; refuse on any difference "
    "(the file is left as it is).",
)
@click.option(
    "--lab",
    help="Build each task's image once in this provisioned lab against the recording mirror, "
    "run its oracle on it, and record what the build and the trial took beyond the frozen set "
    "into the resolution as it stands (with --update: into the updated one); minutes per task "
    "under emulation.",
)
@click.option(
    "--task",
    "task_ids",
    multiple=True,
    metavar="ID",
    help="With --lab: record only this task (repeatable); the others keep what they recorded.",
)
def resolve_command(
    lock_path: Path,
    update: bool,
    upgrade: bool,
    check: bool,
    lab: str | None,
    task_ids: tuple[str, ...],
) -> None:
    """Fetch LOCK's recorded artifacts for its guest into the host cache (--update: re-resolve)."""
    if update and check:
        raise InputError("give --update or --check, not both")
    if upgrade and not update:
        raise InputError("--upgrade chooses every pin afresh in an update: give it with --update")
    if lab is not None and check:
        raise InputError("--lab records into the resolution: give it without --check")
    if task_ids and lab is None:
        raise InputError("--task chooses which tasks --lab records: give it with --lab")
    if update:
        lines = update_resolution(lock_path, lab=lab, task_ids=task_ids, upgrade=upgrade)
    elif lab is not None:
        lines = record_resolution(lock_path, lab, task_ids)
    elif check:
        lines = check_resolution(lock_path)
    else:
        lines = fetch_resolution(lock_path)
    for line in lines:
        click.echo(line)


def fetch_resolution(lock_path: Path, paths: CachePaths | None = None) -> list[str]:
    """Fetch what the committed resolution records; refuse one that does not cover the lock."""
    lock = load_lock(lock_path)
    path = resolution_path(lock_path, lock)
    recorded = load_resolution(path, lock, lock_path)
    paths = paths or CachePaths.default()
    started = time.monotonic()
    report = asyncio.run(
        fetch_recorded(recorded, path, REPO_ROOT, ArtifactStore(paths), _console(), lock.tasks)
    )
    return [
        f"{report.summary()} ({time.monotonic() - started:.1f} s; store {paths.artifacts})",
        f"{path}: as recorded, no change ({len(recorded.artifacts)} artifacts; environment "
        f"{recorded.environment_fingerprint})",
    ]


def update_resolution(
    lock_path: Path,
    paths: CachePaths | None = None,
    sections: frozenset[Section] = ALL_SECTIONS,
    lab: str | None = None,
    task_ids: tuple[str, ...] = (),
    upgrade: bool = False,
) -> list[str]:
    """Resolve again, write the resolution and its lockfiles; one line per change. The pins
    the resolution records are where it starts (``upgrade``: every pin is chosen afresh). With
    a ``lab``, each task's build and trial are then recorded into it (a line per task)."""
    lock = load_lock(lock_path)
    _known_tasks(lock_path, lock, task_ids)
    path = resolution_path(lock_path, lock)
    previous = read_model(path, RecordedContent) if path.is_file() else None
    paths = paths or CachePaths.default()
    kept = None if previous is None or upgrade else _kept_pins(path, previous)
    resolution, summary = _resolve(lock_path, paths, sections, previous, kept)
    _write_lockfiles(path, resolution, ArtifactStore(paths))
    write_model(path, resolution)
    recorded_lines: list[str] = []
    if lab is not None:
        resolution, recorded_lines = _recorded_in_lab(lock, path, resolution, lab, task_ids, paths)
    return [summary, *recorded_lines, *_changed(lock, path, previous, resolution)]


def record_resolution(
    lock_path: Path, lab: str, task_ids: tuple[str, ...] = (), paths: CachePaths | None = None
) -> list[str]:
    """Each task's build and trial recorded in ``lab`` into the committed resolution as it
    stands: nothing else is resolved again (a registry's newer answers stay out)."""
    lock = load_lock(lock_path)
    _known_tasks(lock_path, lock, task_ids)
    paths = paths or CachePaths.default()
    fetched = fetch_resolution(lock_path, paths)  # the mirror serves the set from the store
    path = resolution_path(lock_path, lock)
    previous = load_resolution(path, lock, lock_path)
    resolution, lines = _recorded_in_lab(lock, path, previous, lab, task_ids, paths)
    return [fetched[0], *lines, *_changed(lock, path, previous, resolution)]


def _kept_pins(path: Path, previous: RecordedContent) -> KeptPins:
    """The recorded resolution's pins: its wheels, and the lockfiles written beside it."""
    lockfiles = {
        tree.harness: lockfile_path(path, tree.harness).read_bytes()
        for tree in previous.harness_trees
        if lockfile_path(path, tree.harness).is_file()
    }
    return KeptPins.of(previous.artifacts, lockfiles)


def _known_tasks(lock_path: Path, lock: Lock, task_ids: tuple[str, ...]) -> None:
    unknown = sorted(set(task_ids) - set(lock.tasks.ids))
    if unknown:
        raise InputError(f"{lock_path}: no task {', '.join(unknown)} in the lock's [tasks]")


def _recorded_in_lab(
    lock: Lock, path: Path, resolution: Resolution, lab: str, task_ids: tuple[str, ...],
    paths: CachePaths,
) -> tuple[Resolution, list[str]]:  # fmt: skip
    """``resolution`` (written at ``path``) with what the lab's recordings of the tasks (all,
    or ``task_ids``) took, written again; a line per task."""
    recorded = tuple(
        task
        for task in task_derivations(lock, resolution.tasks)
        if not task_ids or task.id in task_ids
    )
    builds = record_task_builds(lock, path, lab_guest(lab), recorded, suite_packages(lock, paths))
    served = tuple(artifact for build in builds for artifact in build.served)
    resolution = merge_recorded(resolution, served, (build.task for build in builds))
    write_model(path, resolution)
    return resolution, [build.line() for build in builds]


def _changed(
    lock: Lock, path: Path, previous: RecordedContent | Resolution | None, resolution: Resolution
) -> list[str]:
    before = previous.environment_fingerprint if previous else "(none)"
    return [
        *(changes(previous, resolution) or ["no change"]),
        f"{len(resolution.artifacts)} artifacts for {lock.guest.arch}, written to {path}",
        f"environment {before} -> {resolution.environment_fingerprint}"
        if before != resolution.environment_fingerprint
        else f"environment {before} (unchanged)",
    ]


def check_resolution(lock_path: Path) -> list[str]:
    lock = load_lock(lock_path)
    path = resolution_path(lock_path, lock)
    recorded = load_resolution(path, lock, lock_path)
    resolution, summary = _resolve(lock_path, CachePaths.default(), ALL_SECTIONS, recorded)
    difference = recorded.artifact_difference(resolution)
    if difference is not None:
        raise RunnerError(f"{path}: differs from a fresh resolution: {difference}")
    return [summary, f"{path}: matches a fresh resolution ({len(resolution.artifacts)} artifacts)"]


def _resolve(
    lock_path: Path,
    paths: CachePaths,
    sections: frozenset[Section],
    previous: RecordedContent | Resolution | None,
    kept: KeptPins | None = None,
) -> tuple[Resolution, str]:
    """A resolution from the sources (starting from the ``kept`` pins, else afresh), keeping
    what ``previous`` recorded of the lock's tasks' builds."""
    started = time.monotonic()
    lock = load_lock(lock_path)
    resolved = asyncio.run(resolve_lock(lock, REPO_ROOT, paths, _console(), sections, kept))
    carried = carried_records(previous.artifacts if previous else (), lock.tasks.ids)
    seconds = time.monotonic() - started
    summary = (
        f"{resolved.report.summary()} ({seconds:.1f} s; {resolved.total_bytes / 1e6:.1f} MB; "
        f"store {paths.artifacts})"
    )
    return merge_recorded(resolved.resolution, carried, ()), summary


def _write_lockfiles(path: Path, resolution: Resolution, store: ArtifactStore) -> None:
    """The harness trees' lockfiles beside the resolution, and no stale one."""
    keep = {lockfile_path(path, tree.harness) for tree in resolution.harness_trees}
    if lockfiles_dir(path).is_dir():
        for stale in set(lockfiles_dir(path).iterdir()) - keep:
            stale.unlink()
    for tree in resolution.harness_trees:
        write_atomic(lockfile_path(path, tree.harness), store.blob(tree.lockfile).read_bytes())


def _console() -> Console:
    return Console(stderr=True)
