"""The image store: find a verified image by input hash, or build it once.

An entry appears only by ``os.replace`` of a finished staging directory, under a per-entry file
lock, so a crashed or concurrent build never looks like a cache hit. A hit is checked: the
manifest must validate, name the same input hash, and every artifact must match its sha256; an
entry that fails this is rebuilt.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from images.build import build_image
from images.build_tree import remove_build_tree
from images.buildlog import BuildLog
from images.manifest import ARTIFACT_NAMES, ImageManifest
from images.paths import ImagePaths, StorePaths, default_store_root
from images.recipe import RECIPE, ImageInputs, Recipe, input_hash
from runner.core.canonical import canonical_json, file_digest
from runner.core.errors import RunnerError
from runner.core.files import write_atomic
from runner.spec.lock import Guest


class CorruptEntry(Exception):
    """A store entry that exists but cannot be trusted; the message says why."""


def verified_manifest(entry: ImagePaths, expected_hash: str) -> ImageManifest:
    """The entry's manifest, after checking it and every artifact; else ``CorruptEntry``."""
    try:
        manifest = ImageManifest.model_validate_json(entry.manifest.read_bytes())
    except (OSError, ValidationError) as error:
        raise CorruptEntry(f"manifest unreadable: {error}".splitlines()[0]) from None
    if manifest.input_hash != expected_hash:
        raise CorruptEntry(f"manifest is for {manifest.input_hash}")
    for name in ARTIFACT_NAMES:
        path = entry.artifact(name)
        if not path.is_file():
            raise CorruptEntry(f"{name} is missing")
        if file_digest(path) != manifest.files.get(name):
            raise CorruptEntry(f"{name} does not match its sha256")
    return manifest


class ImageStore:
    def __init__(self, root: Path | None = None, console: Console | None = None) -> None:
        self.paths = StorePaths(root or default_store_root())
        self.console = console or Console(stderr=True, soft_wrap=True)

    def entry(self, input_hash: str) -> ImagePaths:
        return self.paths.entry(input_hash)

    def find(self, input_hash: str) -> ImageManifest | None:
        """The verified image for this input hash, or None (absent or corrupt)."""
        entry = self.paths.entry(input_hash)
        if not entry.dir.exists():
            return None
        try:
            return verified_manifest(entry, input_hash)
        except CorruptEntry:
            return None

    def build(self, guest: Guest, recipe: Recipe = RECIPE) -> ImageManifest:
        """The image for this guest: from the store if verified, else built now."""
        inputs = ImageInputs.from_guest(guest)
        wanted = input_hash(inputs, recipe)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with self._locked(wanted):
            entry = self.paths.entry(wanted)
            if entry.dir.exists():
                try:
                    manifest = verified_manifest(entry, wanted)
                except CorruptEntry as reason:
                    self.console.print(
                        f"cached image {entry.dir} is corrupt ({reason}): rebuilding"
                    )
                    shutil.rmtree(entry.dir)
                else:
                    self.console.print(f"cache hit: {entry.dir}")
                    return manifest
            return self._build(inputs, recipe, wanted)

    def _build(self, inputs: ImageInputs, recipe: Recipe, wanted: str) -> ImageManifest:
        for stale in self.paths.stale_stagings():
            remove_build_tree(stale)
        staging = self.paths.staging(wanted)
        log = BuildLog(staging.out.build_log, self.console)
        log.stage("build", f"{wanted} -> {self.paths.entry(wanted).dir}")
        try:
            manifest = build_image(inputs, recipe, wanted, staging, log)
            write_atomic(staging.out.manifest, canonical_json(manifest) + b"\n")
            staging.out.manifest.chmod(0o644)  # readable like the artifacts beside it
            log.stage("done", f"{manifest.build_seconds:.0f} s")
        except BaseException as error:
            log.close()
            failed_log = self.paths.failed_log(wanted)
            shutil.move(staging.out.build_log, failed_log)
            remove_build_tree(staging.dir)
            if isinstance(error, RunnerError):
                raise RunnerError(f"{error} (log: {failed_log})") from None
            raise
        log.close()
        staging.out.dir.replace(self.paths.entry(wanted).dir)
        remove_build_tree(staging.dir)
        return manifest

    def _locked(self, wanted: str) -> AbstractContextManager[None]:
        return build_lock(self.paths.lock_file(wanted), self.console)


@contextmanager
def build_lock(path: Path, console: Console) -> Iterator[None]:
    """One build of an entry at a time, across processes; a second one waits, saying so."""
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print("another build of this image is running: waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
