"""StorePaths owns the image store; ImagePaths one entry of it. No other code joins these paths.

<store>/                          default <repo>/.cache/images, or $FROZEN_BENCH_CACHE/images
    <hash16>/                     one finished image; <hash16> = first 16 hex of its input hash
        root.qcow2                ext4 root filesystem labelled 'root' (no partition table)
        vmlinuz                   kernel for direct kernel boot
        initrd.img                our small initramfs (busybox + the root filesystem modules)
        manifest.json             ImageManifest: inputs, package versions, file digests
        build.log                 everything the build's tools printed
    .<hash16>.lock                held while that entry is checked or built
    .staging-<hash16>-<pid>/      a build in progress; renamed to <hash16>/ when complete
        rootfs/                   the guest tree mmdebstrap made (removed after the disk)
        debs/                     packages fetched for the initramfs only
        out/                      becomes <hash16>/
    <hash16>.failed.log           the log of the last failed build of that entry
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from images.manifest import ArtifactName
from runner.core.roots import cache_root

_STAGING_NAME = re.compile(r"\.staging-[0-9a-f]{16}-(?P<pid>[0-9]+)")


def _process_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def default_store_root() -> Path:
    return cache_root() / "images"


def short_hash(input_hash: str) -> str:
    return input_hash.removeprefix("sha256:")[:16]


@dataclass(frozen=True)
class ImagePaths:
    """The files of one image; the same layout in the store and in a build's out/ dir."""

    dir: Path

    @property
    def root_qcow2(self) -> Path:
        return self.dir / "root.qcow2"

    @property
    def vmlinuz(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def manifest(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def build_log(self) -> Path:
        return self.dir / "build.log"

    def artifact(self, name: ArtifactName) -> Path:
        return self.dir / name


@dataclass(frozen=True)
class StagingPaths:
    """A build in progress. Everything here is discarded or renamed into the store."""

    dir: Path

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"

    @property
    def debs(self) -> Path:
        return self.dir / "debs"

    @property
    def out(self) -> ImagePaths:
        return ImagePaths(self.dir / "out")

    @property
    def raw_disk(self) -> Path:
        return self.dir / "root.raw"

    @property
    def initramfs_tree(self) -> Path:
        return self.dir / "initramfs"


@dataclass(frozen=True)
class StorePaths:
    root: Path

    def entry(self, input_hash: str) -> ImagePaths:
        return ImagePaths(self.root / short_hash(input_hash))

    def lock_file(self, input_hash: str) -> Path:
        return self.root / f".{short_hash(input_hash)}.lock"

    def staging(self, input_hash: str) -> StagingPaths:
        return StagingPaths(self.root / f".staging-{short_hash(input_hash)}-{os.getpid()}")

    def stale_stagings(self) -> list[Path]:
        """Staging dirs of builds whose process is gone, whatever image they were building."""
        return sorted(
            staging
            for staging in self.root.glob(".staging-*-*")
            if (named := _STAGING_NAME.fullmatch(staging.name))
            and not _process_alive(int(named["pid"]))
        )

    def failed_log(self, input_hash: str) -> Path:
        return self.root / f"{short_hash(input_hash)}.failed.log"
