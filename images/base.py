"""A task's base image, the way its FROM name says (runner.spec.base_images.BaseRecipe), built on
the host from the resolution's pinned Debian packages and nothing else, as an OCI archive.

mmdebstrap's minbase of the recipe's suite plus its packages, from a flat copy:// repository
holding exactly the pinned files (apt cannot take anything else; copy:// because dpkg in the
chroot reads them from its apt cache), made under SOURCE_DATE_EPOCH into a tar (mmdebstrap's
output is reproducible for the same packages and epoch). Then, as customize hooks: the
verifiers' tree laid over it (uv, its config), apt's and pip's only source the lab's mirror, and
for a python image no EXTERNALLY-MANAGED marker (Docker's python images have none, so a
Dockerfile's `pip install` works as upstream). The tar is the image's one layer;
the OCI layout around it is written here at fixed bytes, so the same inputs give the same
archive, manifest digest and image ID on every host. Nothing of the guest is in it.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field

from images.bootstrap import EATMYDATA_HOOKS
from images.buildlog import BuildLog
from images.progress import PackageProgress
from images.recipe import ARCH_RECIPES, ImageArch
from runner.core.apt_index import DebFile, packages_index, release_file
from runner.core.canonical import canonical_json, file_digest, sha256_digest
from runner.core.models import FrozenModel, Sha256
from runner.core.oci import OCI_MANIFEST
from runner.spec.base_images import BaseRecipe

BASE_RECIPE_VERSION = 1
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# As Debian's slim images: no docs, man pages or translations (copyright files stay).
_PATH_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
                  "/usr/share/locale/*", "/usr/share/lintian/*")  # fmt: skip


class BaseImageInputs(FrozenModel):
    """Everything the archive's bytes depend on; its input hash names the build."""

    recipe: BaseRecipe
    arch: ImageArch
    source_date_epoch: int = Field(ge=0)
    debs: tuple[Sha256, ...] = Field(description="the pinned files, sorted")
    overlay: Sha256 = Field(description="the verifiers' tree laid over the root")
    mirror_url: str = Field(description="the lab's mirror as the guest's containers reach it")
    guest_suite: str = Field(description="the suite the mirror's whole apt index is of")

    @property
    def input_hash(self) -> str:
        own = file_digest(Path(__file__))
        return sha256_digest(
            canonical_json([BASE_RECIPE_VERSION, own, self.model_dump(mode="json")])
        )


class BuiltBaseImage(FrozenModel):
    """The record of one build (``<store>/base/<hash16>.json``): which archive it made."""

    input_hash: Sha256
    recipe: str
    image: str
    archive: Sha256
    size: int = Field(ge=0)
    manifest_digest: Sha256
    image_id: str = Field(pattern=r"^[0-9a-f]{64}$")
    build_seconds: float = Field(ge=0)


def build_base_image(
    inputs: BaseImageInputs, debs: list[DebFile], overlay: Path, archive: Path, log: BuildLog
) -> None:
    """Build the image of ``inputs`` into the OCI archive at ``archive``."""
    recipe = inputs.recipe
    with tempfile.TemporaryDirectory(prefix="base-image-", dir=archive.parent) as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        for deb in debs:
            (repo / deb.filename).symlink_to(deb.path)
        index = packages_index(debs)
        (repo / "Packages").write_bytes(index)
        (repo / "Release").write_bytes(release_file(index, recipe.suite, "pinned base packages"))
        rootfs = Path(scratch) / "rootfs.tar"
        log.stage("bootstrap", f"mmdebstrap {recipe.suite} minbase + {', '.join(recipe.packages)}")
        log.run(
            _mmdebstrap_argv(inputs, repo, overlay, rootfs),
            env={
                "SOURCE_DATE_EPOCH": str(inputs.source_date_epoch),
                **ARCH_RECIPES[inputs.arch].emulation_env,
            },
            show=PackageProgress().console_lines,
        )
        log.stage("oci", f"packing {recipe.image}")
        write_oci_archive(inputs, rootfs, archive)


def _mmdebstrap_argv(inputs: BaseImageInputs, repo: Path, overlay: Path, out: Path) -> list[str]:
    recipe = inputs.recipe
    return [
        "mmdebstrap",
        "--verbose",
        "--mode=root",
        "--format=tar",
        "--variant=minbase",
        f"--arch={ARCH_RECIPES[inputs.arch].debian_arch}",
        "--include=" + ",".join(recipe.packages),
        '--aptopt=Acquire::Languages "none"',
        *(f"--dpkgopt=path-exclude={path}" for path in _PATH_EXCLUDES),
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        f"--hook-dir={EATMYDATA_HOOKS}",
        *(f"--customize-hook={hook}" for hook in _customize_hooks(inputs, overlay)),
        recipe.suite,
        str(out),
        f"deb [trusted=yes] copy://{repo} ./",
    ]


def _customize_hooks(inputs: BaseImageInputs, overlay: Path) -> list[str]:
    """Shell run with the image's root as $1, after every package is set up."""
    mirror = inputs.mirror_url.rstrip("/")
    # The mirror's /debian is the guest suite's whole index; another suite's image is given the
    # mirror's index of that suite's files only (runner.lab.mirror), never the guest's.
    debian = f"{mirror}/debian" if inputs.recipe.suite == inputs.guest_suite else (
        f"{mirror}/debian/{inputs.recipe.suite}")  # fmt: skip
    pip_conf = (
        f"[global]\nindex-url = {mirror}/simple\ntrusted-host = {urlsplit(mirror).hostname}\n"
        "root-user-action = ignore\ndisable-pip-version-check = true\n"
    )
    source = f"deb [trusted=yes] {debian} ./\n"
    hooks = [
        f'tar -C "$1" --no-same-owner -xf {shlex.quote(str(overlay))}',
        'rm -f "$1/etc/apt/sources.list" "$1"/etc/apt/sources.list.d/*',
        f'printf %s {shlex.quote(source)} > "$1/etc/apt/sources.list.d/bench-mirror.list"',
        f'printf %s {shlex.quote(pip_conf)} > "$1/etc/pip.conf"',
        # What mmdebstrap copies from the host (its man page: not made reproducible for you).
        ': > "$1/etc/resolv.conf"',
        'printf "localhost\\n" > "$1/etc/hostname"',
    ]
    if inputs.recipe.python:
        hooks.append('rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
    return hooks


def write_oci_archive(inputs: BaseImageInputs, layer: Path, archive: Path) -> None:
    """``layer`` (a root filesystem tar) as the one layer of an OCI archive at fixed bytes."""
    layer_digest = file_digest(layer)
    created = datetime.fromtimestamp(inputs.source_date_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = [f"PATH={_PATH}", *(["LANG=C.UTF-8"] if inputs.recipe.python else [])]
    config = canonical_json(
        {
            "architecture": ARCH_RECIPES[inputs.arch].debian_arch,
            "os": "linux",
            "created": created,
            "config": {"Env": env, "Cmd": ["python3" if inputs.recipe.python else "bash"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created": created, "created_by": f"images.base {inputs.input_hash}"}],
        }
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": _descriptor(_OCI_CONFIG, sha256_digest(config), len(config)),
            "layers": [_descriptor(_OCI_LAYER, layer_digest, layer.stat().st_size)],
        }
    )
    index = canonical_json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    **_descriptor(OCI_MANIFEST, sha256_digest(manifest), len(manifest)),
                    "annotations": {"org.opencontainers.image.ref.name": inputs.recipe.image},
                }
            ],
        }
    )
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as out:
        for name in ("blobs", "blobs/sha256"):
            out.addfile(_entry(name, tarfile.DIRTYPE, 0, 0o755))
        blobs = {sha256_digest(config): config, sha256_digest(manifest): manifest}
        for digest in sorted((*blobs, layer_digest)):
            name = f"blobs/sha256/{digest.removeprefix('sha256:')}"
            if digest in blobs:
                out.addfile(_entry(name, tarfile.REGTYPE, len(blobs[digest])),
                            io.BytesIO(blobs[digest]))  # fmt: skip
            else:
                with layer.open("rb") as handle:
                    out.addfile(_entry(name, tarfile.REGTYPE, layer.stat().st_size), handle)
        out.addfile(_entry("index.json", tarfile.REGTYPE, len(index)), io.BytesIO(index))
        layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
        out.addfile(_entry("oci-layout", tarfile.REGTYPE, len(layout)), io.BytesIO(layout))


def _descriptor(media_type: str, digest: str, size: int) -> dict[str, object]:
    return {"mediaType": media_type, "digest": digest, "size": size}


def _entry(name: str, kind: bytes, size: int, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, 0
    return info
