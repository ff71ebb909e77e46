"""The lock's built base images (``"build"`` in ``[tasks] base_images``) for the guest plan: each
made once by images.base from the resolution's pinned Debian packages, kept in the artifact store
and found again by its input hash (``<image store>/base/<hash16>.json``).

The guest loads each archive as it loads a registry image pinned by digest: the manifest digest
here is what every FROM name read as the recipe must give in Podman, or the deploy fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

from images.base import BaseImageInputs, BuiltBaseImage, build_base_image
from images.buildlog import BuildLog
from images.paths import default_store_root, short_hash
from images.store import build_lock
from runner.cache.store import ArtifactStore
from runner.core.apt_index import DebFile
from runner.core.canonical import canonical_json, file_digest
from runner.core.errors import RunnerError
from runner.core.files import read_model, write_atomic
from runner.core.oci import read_oci_archive
from runner.spec.base_images import BaseRecipe
from runner.spec.lock import Lock
from runner.spec.resolution import PinnedArtifact, Resolution


@dataclass(frozen=True)
class BaseImageBuilt:
    names: tuple[str, ...]  # the FROM names read as it
    record: BuiltBaseImage


def built_base_images(
    lock: Lock, resolution: Resolution, store: ArtifactStore, overlay: str, mirror_url: str
) -> tuple[BaseImageBuilt, ...]:
    """Each built base image of the lock, from the store or built now (its progress on stderr)."""
    console = Console(stderr=True, soft_wrap=True)
    return tuple(
        BaseImageBuilt(names, _built(recipe, lock, resolution, store, overlay, mirror_url, console))
        for recipe, names in lock.tasks.built_images
    )


def _built(
    recipe: BaseRecipe,
    lock: Lock,
    resolution: Resolution,
    store: ArtifactStore,
    overlay: str,
    mirror_url: str,
    console: Console,
) -> BuiltBaseImage:
    debs = [a for a in resolution.artifacts if recipe.id in a.images]
    if not debs:
        raise RunnerError(
            f"base image {recipe.id}: the resolution pins none of its packages: run "
            "'runner resolve --update LOCK'"
        )
    inputs = BaseImageInputs(
        recipe=recipe,
        arch=lock.guest.arch,
        source_date_epoch=lock.guest.source_date_epoch,
        debs=tuple(sorted(deb.sha256 for deb in debs)),
        overlay=overlay,
        mirror_url=mirror_url,
        guest_suite=lock.guest.suite,
    )
    root = default_store_root() / "base"
    root.mkdir(parents=True, exist_ok=True)
    wanted = inputs.input_hash
    record_path = root / f"{short_hash(wanted)}.json"
    with build_lock(root / f".{short_hash(wanted)}.lock", console):
        if record_path.is_file():
            record = read_model(record_path, BuiltBaseImage)
            if record.input_hash == wanted and store.has(record.archive):
                console.print(f"base image {recipe.image}: cache hit ({record_path})")
                return record
        log = BuildLog(root / f"{short_hash(wanted)}.log", console)
        try:
            record = _build(inputs, debs, store, log)
        except RunnerError as error:
            raise RunnerError(f"base image {recipe.id}: {error} (log: {log.path})") from None
        finally:
            log.close()
        write_atomic(record_path, canonical_json(record) + b"\n")
    return record


def _build(
    inputs: BaseImageInputs, debs: list[PinnedArtifact], store: ArtifactStore, log: BuildLog
) -> BuiltBaseImage:
    log.stage("base image", f"{inputs.recipe.image} ({len(debs)} pinned packages)")
    temp = store.temp_path(f"{inputs.recipe.id}.oci.tar")
    try:
        build_base_image(
            inputs,
            [DebFile(store.blob(d.sha256), d.filename, d.size, d.sha256) for d in debs],
            store.blob(inputs.overlay),
            temp,
            log,
        )
        image = read_oci_archive(temp)
        size = temp.stat().st_size
        archive = store.adopt(temp, file_digest(temp).removeprefix("sha256:"))
    finally:
        temp.unlink(missing_ok=True)
    log.stage("done", f"{log.elapsed:.0f} s, manifest {image.manifest_digest}")
    return BuiltBaseImage(
        input_hash=inputs.input_hash,
        recipe=inputs.recipe.id,
        image=inputs.recipe.image,
        archive=archive,
        size=size,
        manifest_digest=image.manifest_digest,
        image_id=image.image_id,
        build_seconds=round(log.elapsed, 1),
    )
