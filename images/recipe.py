"""What an image is built from: the lock's guest inputs plus this recipe's own constants.

The input hash names a store entry. It covers exactly what changes the image's bytes: the guest
fields that reach the build (not memory or vCPUs, which only the VM definition uses), the
recipe constants below and the content of every images/ file that shapes the output. A change
to any of them is a new entry; anything else (the CLI, the store, progress printing) is not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import InputError
from runner.spec.lock import Guest

RECIPE_VERSION = 1

IMAGES_DIR = Path(__file__).resolve().parent
GUEST_OVERLAY_DIR = IMAGES_DIR / "guest"
INITRAMFS_INIT = IMAGES_DIR / "initramfs" / "init"

# Files whose content shapes the image's bytes (paths relative to images/; dirs recursively).
OUTPUT_SHAPING_FILES = (
    "recipe.py",
    "bootstrap.py",
    "configure.py",
    "initramfs.py",
    "disk.py",
    "guest",
    "initramfs",
)

ImageArch = Literal["aarch64", "x86_64"]


class _Constants(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArchRecipe(_Constants):
    """What differs between guest architectures; the lock's arch's entry is hashed."""

    debian_arch: str
    kernel_package: str  # must be in the lock's guest.packages
    # Loaded in the initramfs with their modules.dep dependencies (a built-in one is skipped).
    # crc32c_generic is ext4's soft dependency: without modprobe nobody would load it.
    initramfs_modules: tuple[str, ...]
    kernel_cmdline: str
    # The CPU qemu-user presents to the package scripts mmdebstrap runs (None: its default).
    emulated_cpu: str | None = None

    @property
    def emulation_env(self) -> dict[str, str]:
        """What qemu-user reads from the environment of the processes it emulates."""
        return {"QEMU_CPU": self.emulated_cpu} if self.emulated_cpu else {}


ARCH_RECIPES: dict[str, ArchRecipe] = {
    "aarch64": ArchRecipe(
        debian_arch="arm64",
        kernel_package="linux-image-arm64",
        initramfs_modules=("crc32c_generic", "virtio_blk", "ext4"),
        kernel_cmdline="root=LABEL=root rw console=ttyAMA0",
        # qemu-user's default CPU, "max", has pointer authentication by the architected QARMA
        # cipher, which "can be quite slow to emulate" (QEMU's docs, Arm CPU Features:
        # pauth-impdef). Debian's arm64 binaries sign and check the return address of nearly
        # every function, so every call paid: perl 8.2 s -> 0.6 s, byte-compiling the stdlib
        # 34 s -> 5 s, the udev hwdb 30 s -> 2 s. An ARMv8.0 core has no PAuth (those
        # instructions are NOPs there); cortex-a57 is also the CPU the locks give the VM.
        emulated_cpu="cortex-a57",
    ),
    # q35's disk is a virtio PCI device: Debian's amd64 kernel has virtio_pci as a module.
    "x86_64": ArchRecipe(
        debian_arch="amd64",
        kernel_package="linux-image-amd64",
        initramfs_modules=("crc32c_generic", "virtio_pci", "virtio_blk", "ext4"),
        kernel_cmdline="root=LABEL=root rw console=ttyS0",
    ),
}


class Recipe(_Constants):
    """The recipe's constants: every one of them is hashed into the input hash."""

    version: int = RECIPE_VERSION
    variant: Literal["minbase"] = "minbase"
    # Docs, man pages, translations: nothing in the guest reads them; copyright files stay.
    dpkg_path_excludes: tuple[str, ...] = (
        "/usr/share/doc/*",
        "/usr/share/man/*",
        "/usr/share/info/*",
        "/usr/share/locale/*",
        "/usr/share/lintian/*",
        # Kernel modules for hardware a headless virtio guest never has: fewer files to unpack
        # and for depmod to read, both under emulation.
        *(
            f"/usr/lib/modules/*/kernel/{tree}/*"
            for tree in (
                "drivers/gpu",
                "drivers/media",
                "drivers/net/wireless",
                "drivers/net/ethernet",
                "drivers/infiniband",
                "drivers/iio",
                "drivers/staging",
                "drivers/bluetooth",
                "net/bluetooth",
                "net/wireless",
                "net/mac80211",
                "sound",
            )
        ),
    )
    dpkg_path_includes: tuple[str, ...] = ("/usr/share/doc/*/copyright",)
    # Our initramfs (see initramfs.py) is made from this package, not by initramfs-tools.
    initramfs_package: str = "busybox-static"
    fs_label: str = "root"
    units_enabled: tuple[str, ...] = (
        "systemd-networkd.service",
        "ssh.service",
        "sshd-keygen.service",
        "lab-authorized-key.service",
        "lab-host-key.service",
    )
    # Nothing may wait for the network at boot. (Every timer is masked too: images/configure.py.)
    units_masked: tuple[str, ...] = ("systemd-networkd-wait-online.service",)


RECIPE = Recipe()


class ImageInputs(_Constants):
    """The guest fields of the lock that reach the image (packages as a sorted set)."""

    arch: ImageArch
    suite: str
    mirror: str
    source_date_epoch: int = Field(ge=0)
    disk_gib: int
    packages: tuple[str, ...]

    @classmethod
    def from_guest(cls, guest: Guest) -> ImageInputs:
        if guest.arch not in ARCH_RECIPES:
            raise InputError(
                f"images: no recipe for guest arch {guest.arch!r} (known: {sorted(ARCH_RECIPES)})"
            )
        kernel = ARCH_RECIPES[guest.arch].kernel_package
        if kernel not in guest.packages:
            raise InputError(
                f"images: guest.packages must include {kernel} for a {guest.arch} guest"
            )
        return cls(
            arch=guest.arch,
            suite=guest.suite,
            mirror=guest.mirror,
            source_date_epoch=guest.source_date_epoch,
            disk_gib=guest.disk_gib,
            packages=tuple(sorted(guest.packages)),
        )

    @property
    def arch_recipe(self) -> ArchRecipe:
        return ARCH_RECIPES[self.arch]

    @property
    def debian_arch(self) -> str:
        return self.arch_recipe.debian_arch


def recipe_file_digests(images_dir: Path = IMAGES_DIR) -> dict[str, str]:
    """``relative path -> sha256:...`` for every output-shaping file (``+x`` if executable)."""
    digests: dict[str, str] = {}
    for name in OUTPUT_SHAPING_FILES:
        top = images_dir / name
        paths = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in paths:
            if "__pycache__" in path.parts:
                continue
            digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
            # The executable bit is copied into the guest, so it is an input too.
            if path.stat().st_mode & 0o111:
                digest += " +x"
            digests[path.relative_to(images_dir).as_posix()] = digest
    return digests


def input_hash(inputs: ImageInputs, recipe: Recipe = RECIPE) -> str:
    """``sha256:`` over the canonical JSON of the guest inputs, recipe and recipe files."""
    document = {
        "inputs": inputs.model_dump(mode="json"),
        "recipe": recipe.model_dump(mode="json"),
        "arch_recipe": inputs.arch_recipe.model_dump(mode="json"),
        "recipe_files": recipe_file_digests(),
    }
    return sha256_digest(canonical_json(document))
