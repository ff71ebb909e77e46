"""Fetching a committed resolution: exactly the recorded artifacts, nothing asked of a resolver.

Every artifact is fetched from its recorded URL and must have its recorded sha256 and size; a
pinned ``file:`` tarball must still have its recorded digest; a ``git+`` package is fetched at
its commit and packed again, and the tarball must be the recorded one byte for byte; a registry
image missing from the store is pulled by its digest and packed again, and must likewise be the
recorded archive byte for byte (runner.artifacts.oci says why it can be); each
harness tree's lockfile comes from the file committed beside the resolution and must have its
recorded digest; a git task source is fetched at its commit and each task's tree must have its
recorded digest. Any difference
fails closed, naming the artifact: the record is never rewritten here.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from runner.artifacts.fetch import Fetched, FetchReport, Wanted, fetch_all
from runner.artifacts.git import pack_git
from runner.artifacts.oci import fetch_recorded_image
from runner.artifacts.task_source import check_recorded, fetch_tasks
from runner.cache.store import ArtifactStore
from runner.core.errors import RunnerError
from runner.spec.lock import PinnedPackage, TaskSource
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import GitPackage, PinnedArtifact, Resolution, lockfile_path

_RECORD = "the resolution"


async def fetch_recorded(
    resolution: Resolution,
    resolution_file: Path,
    paths_root: Path,
    store: ArtifactStore,
    console: Console,
    tasks: TaskSource,
) -> FetchReport:
    if resolution.tasks:
        check_recorded(resolution.tasks, await fetch_tasks(tasks, store.paths))
    for record in resolution.git_packages:
        await _repack(record, store)
    for artifact in resolution.artifacts:
        if artifact.url.startswith("file:"):
            tarball = paths_root / artifact.url.removeprefix("file:")
            if not tarball.is_file():
                raise RunnerError(f"{_name(artifact)}: no such file {tarball}")
            _check_digest(artifact, store.add_file(tarball))
    images = [artifact for artifact in resolution.artifacts if artifact.kind == "oci-image"]
    downloads = [artifact for artifact in resolution.artifacts if artifact.kind != "oci-image"]
    wanted = [
        Wanted(artifact.url, artifact.filename, sha256=artifact.sha256, stated_by=_RECORD)
        for artifact in downloads
    ]
    report = await fetch_all(store, wanted, console)
    platform = GuestPlatform(resolution.arch)
    for image in images:
        # Its sha256 is the recorded one either way (checked), so its size is the recorded size.
        report.fetched[image.url] = Fetched(image.sha256, image.size)
        if await fetch_recorded_image(image, platform, store, resolution.tools.skopeo):
            report.downloaded_files += 1
            report.downloaded_bytes += image.size
        else:
            report.cached_files += 1
            report.cached_bytes += image.size
    for artifact in resolution.artifacts:
        fetched = report.fetched[artifact.url]
        _check_digest(artifact, fetched.digest)
        if fetched.size != artifact.size:
            raise RunnerError(
                f"{_name(artifact)}: {fetched.size} bytes, {_RECORD} records {artifact.size}"
            )
    for tree in resolution.harness_trees:
        path = lockfile_path(resolution_file, tree.harness)
        if not path.is_file():
            raise RunnerError(f"{path}: missing; {_RECORD} names it for harness {tree.harness}")
        digest = store.add_file(path)
        if digest != tree.lockfile:
            raise RunnerError(f"{path}: sha256 is {digest}, {_RECORD} records {tree.lockfile}")
    return report


async def _repack(record: GitPackage, store: ArtifactStore) -> None:
    package = PinnedPackage(source=record.source, tag=record.tag, name=record.name)
    packed = (await pack_git(package, store)).record
    if packed.sha256 != record.sha256:
        raise RunnerError(
            f"{record.source}: packed tarball {record.filename} has sha256 {packed.sha256}, "
            f"{_RECORD} records {record.sha256} (packed with {record.packed_with}; "
            f"here {packed.packed_with})"
        )


def _check_digest(artifact: PinnedArtifact, digest: str) -> None:
    if digest != artifact.sha256:
        raise RunnerError(
            f"{_name(artifact)}: sha256 is {digest}, {_RECORD} records {artifact.sha256}"
        )


def _name(artifact: PinnedArtifact) -> str:
    return f"{artifact.kind}:{artifact.name}@{artifact.version} ({artifact.url})"
