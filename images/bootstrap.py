"""Stage 1: mmdebstrap makes the guest tree from Debian packages (the only emulated stage).

Speed under qemu-user comes from an emulated CPU without pointer authentication (see
ArchRecipe.emulated_cpu) and from doing less in the guest's arch: minbase, no docs or
translations, dpkg under eatmydata, no initramfs-tools run (update-initramfs is diverted to a
no-op while packages install; initramfs.py makes the initramfs natively afterwards) and apt run
natively for the one extra download.
"""

from __future__ import annotations

import shlex

from images.buildlog import BuildLog
from images.paths import StagingPaths
from images.progress import PackageProgress
from images.recipe import ImageInputs, Recipe

EATMYDATA_HOOKS = "/usr/share/mmdebstrap/hooks/eatmydata"
UPDATE_INITRAMFS = "/usr/sbin/update-initramfs"

_DIVERT_UPDATE_INITRAMFS = (
    f'chroot "$1" dpkg-divert --quiet --local --rename --add {UPDATE_INITRAMFS}'
    f' && printf "#!/bin/sh\\nexit 0\\n" > "$1{UPDATE_INITRAMFS}"'
    f' && chmod 755 "$1{UPDATE_INITRAMFS}"'
)
_RESTORE_UPDATE_INITRAMFS = (
    f'rm "$1{UPDATE_INITRAMFS}"'
    f' && chroot "$1" dpkg-divert --quiet --local --rename --remove {UPDATE_INITRAMFS}'
)


def _fetch_initramfs_package(package: str, debs_dir: str) -> str:
    """A hook that downloads one .deb into debs_dir from the chroot's package lists (same mirror
    state). The host's apt reads them through mmdebstrap's own apt config (its man page:
    MMDEBSTRAP_APT_CONFIG, for hooks): the chroot's apt, emulated, took 30 s to load them."""
    return (
        f"mkdir -p {shlex.quote(debs_dir)} && cd {shlex.quote(debs_dir)}"
        f' && APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get download --quiet {package}'
    )


def mmdebstrap_argv(inputs: ImageInputs, recipe: Recipe, staging: StagingPaths) -> list[str]:
    dpkg_options = [f"path-exclude={path}" for path in recipe.dpkg_path_excludes] + [
        f"path-include={path}" for path in recipe.dpkg_path_includes
    ]
    return [
        "mmdebstrap",
        "--verbose",
        "--mode=root",
        "--format=directory",
        f"--variant={recipe.variant}",
        f"--arch={inputs.debian_arch}",
        "--include=" + ",".join(inputs.packages),
        '--aptopt=Acquire::Languages "none"',
        *(f"--dpkgopt={option}" for option in dpkg_options),
        f"--hook-dir={EATMYDATA_HOOKS}",
        f"--essential-hook={_DIVERT_UPDATE_INITRAMFS}",
        f"--customize-hook={_RESTORE_UPDATE_INITRAMFS}",
        "--customize-hook=" + _fetch_initramfs_package(recipe.initramfs_package, str(staging.debs)),
        inputs.suite,
        str(staging.rootfs),
        inputs.mirror,
    ]


def bootstrap(inputs: ImageInputs, recipe: Recipe, staging: StagingPaths, log: BuildLog) -> None:
    log.stage("bootstrap", f"mmdebstrap {inputs.suite}/{inputs.debian_arch} (emulated; slow)")
    log.run(
        mmdebstrap_argv(inputs, recipe, staging),
        env={
            "SOURCE_DATE_EPOCH": str(inputs.source_date_epoch),
            **inputs.arch_recipe.emulation_env,
        },
        show=PackageProgress().console_lines,
    )
