"""The image manifest: what an image was built from and what it holds, validated on load."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from runner.core.models import Sha256

SCHEMA_VERSION: Literal[1] = 1

ArtifactName = Literal["root.qcow2", "vmlinuz", "initrd.img"]
ARTIFACT_NAMES: tuple[ArtifactName, ...] = get_args(ArtifactName)


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolVersions(_FileModel):
    """Host tools that made the image (Debian package versions)."""

    mmdebstrap: str
    qemu_user_static: str
    e2fsprogs: str
    qemu_utils: str


class ImageManifest(_FileModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    input_hash: Sha256
    arch: str
    suite: str
    mirror: str
    source_date_epoch: int = Field(ge=0)
    disk_gib: int = Field(ge=1)
    # Every installed package of the guest, from its dpkg database: name -> version.
    packages: dict[str, str] = Field(min_length=1)
    # Packages unpacked into the initramfs only (never installed in the guest).
    initramfs_packages: dict[str, str]
    files: dict[ArtifactName, Sha256]
    kernel_version: str = Field(min_length=1)
    # Boot with this, plus ``lab.authorized_key=<base64 public key line>`` to allow a login.
    kernel_cmdline: str
    build_seconds: float = Field(ge=0)
    tools: ToolVersions
