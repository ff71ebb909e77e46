"""Stage 3: our initramfs, made natively in a second instead of by initramfs-tools emulated.

It holds busybox (from the busybox-static .deb of the same mirror), the kernel modules the root
filesystem needs with their dependencies (decompressed here: busybox's insmod then needs no xz)
and initramfs/init. The cpio is written by this module because its bytes must be reproducible:
fixed inode numbers, owner root, one mtime (SOURCE_DATE_EPOCH), sorted entries, gzip mtime 0.
"""

from __future__ import annotations

import gzip
import io
import lzma
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from images.buildlog import BuildLog
from images.recipe import INITRAMFS_INIT, ArchRecipe, Recipe
from runner.core.errors import RunnerError

BUSYBOX_IN_DEB = "./usr/bin/busybox"
_DIRS = ("bin", "dev", "etc", "lib", "lib/modules", "proc", "root", "sys")
_CONSOLE = (5, 1)


@dataclass(frozen=True)
class CpioEntry:
    name: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def kernel_version(rootfs: Path) -> str:
    versions = sorted(p.name for p in (rootfs / "usr/lib/modules").iterdir() if p.is_dir())
    if len(versions) != 1:
        raise RunnerError(f"images: expected one kernel in the guest, found {versions}")
    return versions[0]


def module_load_order(modules_dir: Path, wanted: tuple[str, ...]) -> list[str]:
    """Module files (relative to modules_dir) to insmod in order: dependencies first."""
    depends: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, deps = line.partition(":")
        depends[path] = deps.split()
        by_name[_module_name(path)] = path
    builtin = {_module_name(p) for p in (modules_dir / "modules.builtin").read_text().split()}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        # modules.dep lists all transitive dependencies, deepest last; load them deepest first.
        for dependency in reversed(depends[path]):
            visit(dependency)
        order.append(path)

    for name in wanted:
        key = name.replace("-", "_")
        if key in builtin:
            continue
        if key not in by_name:
            raise RunnerError(f"images: kernel module {name!r} is neither a module nor built in")
        visit(by_name[key])
    return order


def _module_name(path: str) -> str:
    return Path(path).name.split(".ko")[0].replace("-", "_")


def _read_module(path: Path) -> bytes:
    data = path.read_bytes()
    return lzma.decompress(data) if path.name.endswith(".xz") else data


def busybox_from_deb(deb: Path) -> bytes:
    fsys = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(fsys)) as archive:
        member = archive.extractfile(BUSYBOX_IN_DEB)
        if member is None:
            raise RunnerError(f"images: {deb.name} has no {BUSYBOX_IN_DEB}")
        return member.read()


def deb_version(deb: Path) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()


def initramfs_entries(busybox: bytes, modules: dict[str, bytes], init: bytes) -> list[CpioEntry]:
    entries = [CpioEntry(name, stat.S_IFDIR | 0o755) for name in _DIRS]
    entries.append(CpioEntry("dev/console", stat.S_IFCHR | 0o600, rdev=_CONSOLE))
    entries.append(CpioEntry("bin/busybox", stat.S_IFREG | 0o755, busybox))
    entries.append(CpioEntry("init", stat.S_IFREG | 0o755, init))
    order = "".join(f"{name}\n" for name in modules).encode()
    entries.append(CpioEntry("etc/modules-order", stat.S_IFREG | 0o644, order))
    entries.extend(
        CpioEntry(f"lib/modules/{name}.ko", stat.S_IFREG | 0o644, data)
        for name, data in modules.items()
    )
    return sorted(entries, key=lambda entry: entry.name)


def newc_archive(entries: list[CpioEntry], mtime: int) -> bytes:
    """A cpio archive in the kernel's "newc" format (see the kernel's initramfs_buffer_format)."""
    out = bytearray()
    for number, entry in enumerate([*entries, CpioEntry("TRAILER!!!", 0)], start=1):
        is_trailer = entry.name == "TRAILER!!!"
        name = entry.name.encode() + b"\0"
        fields = (
            0 if is_trailer else number,
            entry.mode,
            0,  # uid
            0,  # gid
            2 if stat.S_ISDIR(entry.mode) else 1,  # nlink
            0 if is_trailer else mtime,
            len(entry.data),
            0,  # devmajor
            0,  # devminor
            *entry.rdev,
            len(name),
            0,  # check
        )
        out += b"070701" + "".join(f"{field:08x}" for field in fields).encode()
        out += name + b"\0" * (-(110 + len(name)) % 4)
        out += entry.data + b"\0" * (-len(entry.data) % 4)
    return bytes(out)


def build_initramfs(
    rootfs: Path,
    debs_dir: Path,
    recipe: Recipe,
    arch_recipe: ArchRecipe,
    mtime: int,
    out: Path,
    log: BuildLog,
) -> tuple[str, dict[str, str]]:
    """Write the gzipped initramfs; return the kernel version and the packages used."""
    version = kernel_version(rootfs)
    log.stage("initramfs", f"busybox + {', '.join(arch_recipe.initramfs_modules)} for {version}")
    modules_dir = rootfs / "usr/lib/modules" / version
    module_files = module_load_order(modules_dir, arch_recipe.initramfs_modules)
    modules = {_module_name(path): _read_module(modules_dir / path) for path in module_files}
    log.note("modules in load order: " + " ".join(modules))
    debs = sorted(debs_dir.glob(f"{recipe.initramfs_package}_*.deb"))
    if len(debs) != 1:
        raise RunnerError(f"images: expected one {recipe.initramfs_package} .deb, found {debs}")
    entries = initramfs_entries(busybox_from_deb(debs[0]), modules, INITRAMFS_INIT.read_bytes())
    archive = newc_archive(entries, mtime)
    out.write_bytes(gzip.compress(archive, compresslevel=9, mtime=0))
    return version, {recipe.initramfs_package: deb_version(debs[0])}
