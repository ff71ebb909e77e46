"""One cold build, stage by stage, into a staging directory; returns the image's manifest."""

from __future__ import annotations

import shutil
import subprocess

from images.bootstrap import bootstrap
from images.buildlog import BuildLog
from images.configure import configure, installed_packages
from images.disk import convert_to_qcow2, make_filesystem
from images.initramfs import build_initramfs
from images.manifest import ARTIFACT_NAMES, ImageManifest, ToolVersions
from images.paths import StagingPaths
from images.recipe import ImageInputs, Recipe
from runner.core.canonical import file_digest

_TOOL_PACKAGES = {
    "mmdebstrap": "mmdebstrap",
    "qemu_user_static": "qemu-user-static",
    "e2fsprogs": "e2fsprogs",
    "qemu_utils": "qemu-utils",
}


def host_tool_versions() -> ToolVersions:
    versions = {
        field: subprocess.run(
            ["dpkg-query", "--showformat=${Version}", "--show", package],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for field, package in _TOOL_PACKAGES.items()
    }
    return ToolVersions(**versions)


def build_image(
    inputs: ImageInputs, recipe: Recipe, input_hash: str, staging: StagingPaths, log: BuildLog
) -> ImageManifest:
    out = staging.out
    out.dir.mkdir(parents=True, exist_ok=True)
    tools = host_tool_versions()
    bootstrap(inputs, recipe, staging, log)
    configure(staging.rootfs, recipe, log)
    packages = installed_packages(staging.rootfs)
    kernel_version, initramfs_packages = build_initramfs(
        staging.rootfs,
        staging.debs,
        recipe,
        inputs.arch_recipe,
        inputs.source_date_epoch,
        out.initrd,
        log,
    )
    shutil.copyfile(staging.rootfs / "boot" / f"vmlinuz-{kernel_version}", out.vmlinuz)
    make_filesystem(
        staging.rootfs,
        staging.raw_disk,
        size_gib=inputs.disk_gib,
        label=recipe.fs_label,
        input_hash=input_hash,
        epoch=inputs.source_date_epoch,
        log=log,
    )
    log.stage("cleanup", "removing the guest tree")
    shutil.rmtree(staging.rootfs)
    convert_to_qcow2(staging.raw_disk, out.root_qcow2, log)
    staging.raw_disk.unlink()
    log.stage("manifest", "hashing the artifacts")
    return ImageManifest(
        input_hash=input_hash,
        arch=inputs.arch,
        suite=inputs.suite,
        mirror=inputs.mirror,
        source_date_epoch=inputs.source_date_epoch,
        disk_gib=inputs.disk_gib,
        packages=packages,
        initramfs_packages=initramfs_packages,
        files={name: file_digest(out.artifact(name)) for name in ARTIFACT_NAMES},
        kernel_version=kernel_version,
        kernel_cmdline=inputs.arch_recipe.kernel_cmdline,
        build_seconds=round(log.elapsed, 1),
        tools=tools,
    )
