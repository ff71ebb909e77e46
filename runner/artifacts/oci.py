"""Registry base images: pulled by their pinned manifest digest with skopeo, stored as OCI archives.

skopeo copies the image into an OCI image layout (blobs named by their digests, index.json
naming the one manifest), which is packed here with GNU tar at fixed member order, mtimes, owners
and modes. skopeo's own ``oci-archive:`` stamps the current time on every member, so two pulls of
one image would be two files (seen with skopeo 1.9.3); the layout's files are the same bytes at
every pull, so the packed archive is byte-reproducible: ``runner resolve`` without ``--update``
pulls a missing archive again and it must be the recorded file (its sha256), as a ``git+``
package must pack again byte for byte; its manifest digest is checked as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import tempfile
from pathlib import Path

from runner.artifacts.tools import ToolFailed, run_tool, tool_version
from runner.cache.store import ArtifactStore
from runner.core.errors import RunnerError
from runner.core.oci import INDEX_TYPES, OCI_MANIFEST, BadOciArchive, read_oci_archive
from runner.spec.lock import RegistryImage
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import PinnedArtifact

# The trust is the pinned manifest digest, checked here against what was pulled; a host's
# signature policy (/etc/containers/policy.json, absent on many hosts) is not what the lock says.
_SKOPEO = ("skopeo", "--insecure-policy")
# Registries on this host's own loopback: a test's registry or a local mirror, served over plain
# HTTP. TLS would protect nothing that never leaves the host, and the digest is checked anyway;
# every other registry is spoken to over verified TLS only.
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
_TAR = (
    "tar", "--create", "--format=gnu", "--sort=name", "--mtime=@0", "--owner=0", "--group=0",
    "--numeric-owner", "--mode=u=rwX,go=rX",
)  # fmt: skip
_SKOPEO_MESSAGE = re.compile(r'msg="((?:\\.|[^"\\])*)"')


async def skopeo_version() -> str:
    """``skopeo version 1.9.3`` (recorded: the layout files in an archive are skopeo's)."""
    return await tool_version(["skopeo", "--version"], "skopeo --version")


async def image_problems(images: tuple[RegistryImage, ...], platform: GuestPlatform) -> list[str]:
    """One line per image whose pinned manifest the registry does not give as one OCI image."""
    found = await asyncio.gather(*(_problem(image, platform) for image in images))
    return [line for line in found if line]


async def _problem(image: RegistryImage, platform: GuestPlatform) -> str | None:
    args = [*_SKOPEO, "inspect", "--raw", *_tls(image, "tls-verify"), f"docker://{image.reference}"]
    try:
        raw = await run_tool(args, image.reference)
    except ToolFailed as failed:
        return f"{image.reference}: the registry does not give it: {_skopeo_error(failed.stderr)}"
    try:
        media_type = json.loads(raw).get("mediaType")
    except (ValueError, AttributeError):
        return f"{image.reference}: the registry's manifest is not JSON"
    if media_type in INDEX_TYPES:
        return (
            f"{image.reference}: a multi-platform index; pin the digest of its linux/"
            f"{platform.deb_arch} image manifest (skopeo inspect --raw shows them)"
        )
    if media_type != OCI_MANIFEST:
        return (
            f"{image.reference}: a {media_type} manifest; only an OCI image manifest is kept "
            "as pulled (converting it would change the digest)"
        )
    return None


async def pull_image(
    image: RegistryImage, platform: GuestPlatform, store: ArtifactStore
) -> PinnedArtifact:
    """The pinned image as a reproducible OCI archive in the store, its manifest checked."""
    store.paths.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store.paths.tmp, prefix="oci-") as scratch:
        layout = Path(scratch) / "layout"
        await run_tool(
            [
                *_SKOPEO, "copy", "--quiet", "--preserve-digests", *_tls(image, "src-tls-verify"),
                "--override-os", "linux", "--override-arch", platform.deb_arch,
                f"docker://{image.reference}", f"oci:{layout}",
            ],
            f"{image.reference}: skopeo copy",
        )  # fmt: skip
        filename = f"{image.repository.rsplit('/', 1)[-1]}-{image.digest[7:19]}.oci.tar"
        archive = Path(scratch) / filename
        await run_tool(
            [*_TAR, "--file", str(archive), "-C", str(layout), "oci-layout", "index.json", "blobs"],
            f"{image.reference}: tar",
        )
        try:
            pulled = read_oci_archive(archive)
        except BadOciArchive as error:
            raise RunnerError(f"{image.reference}: {error}") from None
        if pulled.manifest_digest != image.digest:
            raise RunnerError(
                f"{image.reference}: skopeo gave manifest {pulled.manifest_digest}, "
                f"the lock pins {image.digest}"
            )
        if (pulled.os, pulled.architecture) != ("linux", platform.deb_arch):
            raise RunnerError(
                f"{image.reference}: an image for {pulled.os}/{pulled.architecture}, "
                f"the guest is linux/{platform.deb_arch}"
            )
        size = archive.stat().st_size
        with archive.open("rb") as handle:
            sha256_hex = hashlib.file_digest(handle, "sha256").hexdigest()
        digest = store.adopt(archive, sha256_hex)
    return PinnedArtifact(
        kind="oci-image",
        name=image.repository,
        version=image.digest,
        url=f"docker://{image.reference}",
        filename=filename,
        sha256=digest,
        size=size,
    )


async def fetch_recorded_image(
    artifact: PinnedArtifact, platform: GuestPlatform, store: ArtifactStore, made_with: str | None
) -> bool:
    """The recorded archive in the store: pulled again only when missing, and then it must be
    the recorded file byte for byte. True when it was pulled."""
    if store.has(artifact.sha256):
        return False
    image = RegistryImage(artifact.name, artifact.version, ())
    pulled = await pull_image(image, platform, store)
    if pulled.sha256 != artifact.sha256:
        here = await skopeo_version()
        raise RunnerError(
            f"{image.reference}: pulled again, its archive has sha256 {pulled.sha256}, the "
            f"resolution records {artifact.sha256} (made with {made_with}; here {here})"
        )
    return True


def _tls(image: RegistryImage, flag: str) -> list[str]:
    host = image.repository.split("/", 1)[0].rsplit(":", 1)[0]
    return [f"--{flag}=false"] if host in _LOOPBACK else []


def _skopeo_error(stderr: str) -> str:
    """skopeo's fatal message without its log framing or the image name it repeats."""
    found = _SKOPEO_MESSAGE.findall(stderr)
    message = found[-1].replace('\\"', '"') if found else stderr.strip() or "no message"
    return re.sub(r'^Error parsing image name "[^"]*": ', "", message)
