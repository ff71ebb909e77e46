"""An OCI archive holding one image (a tar of an OCI image layout): what its manifest says.

Read on the host twice: when ``runner resolve`` has made the archive (its manifest digest must
be the one the lock pins) and when the guest plan tags the loaded image by its ID (Podman's image
ID is the config blob's digest).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.core.errors import RunnerError

# The single-platform image manifest an OCI layout keeps as it was pulled. A Docker v2 manifest
# would have to be converted to OCI for the layout, which changes its digest (and the pin).
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)


class BadOciArchive(RunnerError):
    """Not an OCI archive of exactly one image whose blobs have their digests."""


@dataclass(frozen=True)
class OciImage:
    manifest_digest: str
    config_digest: str
    os: str
    architecture: str

    @property
    def image_id(self) -> str:
        """Podman's ID of the image once loaded: the config blob's digest, without "sha256:"."""
        return self.config_digest.removeprefix("sha256:")


def read_oci_archive(path: Path) -> OciImage:
    """The one image of the OCI archive at ``path``; its manifest and config checked by digest."""
    try:
        with tarfile.open(path) as archive:
            index = _json(_member(archive, "index.json", path), path, "index.json")
            manifests = index.get("manifests")
            if not isinstance(manifests, list) or len(manifests) != 1:
                raise BadOciArchive(f"{path}: index.json must name exactly one manifest")
            descriptor = manifests[0]
            if descriptor.get("mediaType") != OCI_MANIFEST:
                raise BadOciArchive(f"{path}: not an OCI image manifest: {descriptor}")
            manifest_digest = str(descriptor.get("digest"))
            manifest = _json(_blob(archive, manifest_digest, path), path, manifest_digest)
            config_digest = str(manifest.get("config", {}).get("digest"))
            config = _json(_blob(archive, config_digest, path), path, config_digest)
    except (tarfile.TarError, OSError) as error:
        raise BadOciArchive(f"{path}: not a readable tar: {error}") from None
    return OciImage(
        manifest_digest,
        config_digest,
        str(config.get("os")),
        str(config.get("architecture")),
    )


def _member(archive: tarfile.TarFile, name: str, path: Path) -> bytes:
    try:
        handle = archive.extractfile(name)
    except KeyError:
        handle = None
    if handle is None:
        raise BadOciArchive(f"{path}: no {name} in the archive")
    return handle.read()


def _blob(archive: tarfile.TarFile, digest: str, path: Path) -> bytes:
    if not digest.startswith("sha256:"):
        raise BadOciArchive(f"{path}: {digest!r} is not a sha256 digest")
    data = _member(archive, f"blobs/sha256/{digest.removeprefix('sha256:')}", path)
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise BadOciArchive(f"{path}: blob {digest} does not have its digest")
    return data


def _json(data: bytes, path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise BadOciArchive(f"{path}: {what} is not a JSON object")
    return value
