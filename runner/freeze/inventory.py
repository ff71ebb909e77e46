"""The disk inventory: every path of the guest's root filesystem, as the host reads it.

Complete by construction: the whole filesystem is walked (runner.lab.disk mounts it on the
host), and only the scope's ``disk_excludes`` (paths that differ from boot to boot, each with
its reason in runner/freeze/scope.toml) are left out. One entry per path::

    dir <mode> <uid>:<gid>
    file <mode> <uid>:<gid> sha256:<hex>
    symlink <uid>:<gid> -> <target>
    char|block <mode> <uid>:<gid> <major>:<minor>
    fifo|socket <mode> <uid>:<gid>

with `` xattr:<sha256>`` appended when the path has extended attributes (file capabilities,
SELinux labels, overlay markers). ``<mode>`` keeps the setuid, setgid and sticky bits.

Every file of every installed package is also checked against the package's own digests, as
``dpkg --verify`` does: the md5sums dpkg keeps for each package and the conffiles' md5 in its
status file, read from the same disk (those files are themselves inventory entries, so they
cannot change unseen). Paths go through the disk's own directory symlinks (``/bin`` ->
``usr/bin``), dpkg's diversions and its ``path-exclude`` filters, as dpkg resolves them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.models import FrozenModel
from runner.lab.disk import MountedDisk

SCHEMA_VERSION: Literal[1] = 1
_CHUNK = 1 << 20
_SYMLINK_HOPS = 40
DPKG = Path("var/lib/dpkg")


def guest_name(name: str) -> str:
    """A path as the inventory records it: non-UTF-8 bytes escaped, so it can be JSON."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class PackageFile:
    package: str
    md5: str
    conffile: bool = False


def _status_stanzas(text: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        stanza: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                stanza[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                stanza[key] = value.strip()
        if stanza.get("Package"):
            yield stanza


def _diversions(root: Path) -> dict[str, tuple[str, str]]:
    """Diverted path -> (where the diverted file lives, the package that diverted it)."""
    path = root / DPKG / "diversions"
    lines = path.read_text().splitlines() if path.exists() else []
    return {
        lines[i]: (lines[i + 1], lines[i + 2]) for i in range(0, len(lines) - len(lines) % 3, 3)
    }


def _path_filters(root: Path) -> list[tuple[bool, str]]:
    """dpkg's ``path-include``/``path-exclude`` options, in order: (included, glob)."""
    filters: list[tuple[bool, str]] = []
    config = root / "etc/dpkg/dpkg.cfg.d"
    for file in sorted(config.iterdir()) if config.is_dir() else ():
        for line in file.read_text(errors="replace").splitlines():
            option, _, glob = line.strip().partition("=")
            if option in ("path-include", "path-exclude") and glob:
                filters.append((option == "path-include", glob))
    return filters


def _installed(path: str, filters: list[tuple[bool, str]]) -> bool:
    """Whether dpkg installed ``path`` (the last filter that matches it decides)."""
    included = True
    for include, glob in filters:
        if fnmatch.fnmatchcase(path, glob):
            included = include
    return included


def resolve(root: Path, path: str) -> str:
    """``path`` of the guest with its directories' symlinks followed inside ``root`` (the last
    component is not followed: a package's symlink is itself the package's file)."""
    parts = [part for part in path.split("/") if part]
    resolved: list[str] = []
    hops = 0
    while len(parts) > 1:
        part = parts.pop(0)
        if part == "..":
            resolved = resolved[:-1]
            continue
        if part == ".":
            continue
        here = root.joinpath(*resolved, part)
        if here.is_symlink() and hops < _SYMLINK_HOPS:
            hops += 1
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                resolved = []
            continue
        resolved.append(part)
    return "/" + "/".join(resolved + parts)


def package_files(root: Path) -> dict[str, PackageFile]:
    """Every file dpkg installed and keeps a digest of, by its path on the disk."""
    status = (root / DPKG / "status").read_text(errors="replace")
    diversions = _diversions(root)
    filters = _path_filters(root)
    files: dict[str, PackageFile] = {}
    info = root / DPKG / "info"
    for stanza in _status_stanzas(status):
        if not stanza.get("Status", "").endswith(" installed"):
            continue
        package, arch = stanza["Package"], stanza.get("Architecture", "")
        sums = info / f"{package}.md5sums"
        if not sums.exists():
            sums = info / f"{package}:{arch}.md5sums"
        listed: list[tuple[str, str, bool]] = []
        if sums.exists():
            for line in sums.read_text(errors="surrogateescape").splitlines():
                digest, _, name = line.partition("  ")
                if name:
                    listed.append(("/" + name, digest, False))
        for line in stanza.get("Conffiles", "").splitlines():
            words = line.split()
            if len(words) >= 2 and "obsolete" not in words[2:] and words[1] != "newconffile":
                listed.append((words[0], words[1], True))
        for name, digest, conffile in listed:
            diverted = diversions.get(name)
            if diverted is not None and diverted[1] != package:
                name = diverted[0]
            if _installed(name, filters):
                files[resolve(root, guest_name(name))] = PackageFile(package, digest, conffile)
    return files


@dataclass
class Observed:
    """One reading of the disk: the entries, each path's ctime (what changed since: the guest
    disk's credential scan reads only those), and the md5 of each package file found."""

    entries: dict[str, str] = field(default_factory=dict)
    ctimes: dict[str, int] = field(default_factory=dict)
    package_md5: dict[str, str] = field(default_factory=dict)
    packages: dict[str, PackageFile] = field(default_factory=dict)


def _excluded(path: str, excludes: Iterable[str]) -> bool:
    """Whether ``path`` is an excluded path, below one, or matched by an excluded glob."""
    return any(
        path == ex or path.startswith(ex.rstrip("/") + "/") or fnmatch.fnmatchcase(path, ex)
        for ex in excludes
    )


def _metadata(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):04o} {info.st_uid}:{info.st_gid}"


def _xattrs(path: str) -> str:
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return ""
    if not names:
        return ""
    digest = hashlib.sha256()
    for name in names:
        value = os.getxattr(path, name, follow_symlinks=False)
        digest.update(name.encode() + b"\0" + len(value).to_bytes(8, "big") + value)
    return f" xattr:{digest.hexdigest()}"


# A file's content in pieces, from its host path and size (MountedDisk.chunks reads past the
# mount; ``read_through`` reads the file itself).
Contents = Callable[[str, int], Iterable[bytes]]


def read_through(path: str, size: int) -> Iterator[bytes]:
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def _digests(contents: Iterable[bytes], md5: bool) -> tuple[str, str | None]:
    sha = hashlib.sha256()
    package = hashlib.md5(usedforsecurity=False) if md5 else None
    for chunk in contents:
        sha.update(chunk)
        if package is not None:
            package.update(chunk)
    return sha.hexdigest(), package.hexdigest() if package is not None else None


def walk(root: Path, excludes: tuple[str, ...]) -> Iterator[tuple[str, str, os.stat_result]]:
    """(guest path, host path, lstat) of every path below ``root`` but the excluded."""
    pending = [(str(root), "")]
    while pending:
        host, guest = pending.pop()
        with os.scandir(host) as entries:
            for entry in entries:
                path = f"{guest}/{guest_name(entry.name)}"
                if _excluded(path, excludes):
                    continue
                info = entry.stat(follow_symlinks=False)
                yield path, entry.path, info
                if stat.S_ISDIR(info.st_mode):
                    pending.append((entry.path, path))


def _entry(path: str, host: str, info: os.stat_result, xattr: str) -> str:
    """The entry of anything but a regular file (whose digest the caller adds)."""
    mode, meta = info.st_mode, _metadata(info)
    if stat.S_ISREG(mode):
        return f"file {meta}"
    if stat.S_ISDIR(mode):
        return f"dir {meta}{xattr}"
    if stat.S_ISLNK(mode):
        target = guest_name(os.fsdecode(os.readlink(host)))
        return f"symlink {info.st_uid}:{info.st_gid} -> {target}{xattr}"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "char" if stat.S_ISCHR(mode) else "block"
        return f"{kind} {meta} {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}{xattr}"
    return f"{'fifo' if stat.S_ISFIFO(mode) else 'socket'} {meta}{xattr}"


def take_inventory(
    root: Path,
    excludes: tuple[str, ...],
    contents: Contents = read_through,
    workers: int | None = None,
) -> Observed:
    """Read every path of the filesystem mounted at ``root``. Files are hashed on ``workers``
    threads while the walk goes on (reads and hashlib release the GIL); hard links once."""
    observed = Observed(packages=package_files(root))
    by_inode: dict[tuple[int, int], Future[tuple[str, str | None]]] = {}
    regular: list[tuple[str, str, os.stat_result, str, Future[tuple[str, str | None]]]] = []
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        for path, host, info in walk(root, excludes):
            observed.ctimes[path] = info.st_ctime_ns
            xattr = _xattrs(host)
            observed.entries[path] = _entry(path, host, info, xattr)
            if stat.S_ISREG(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key not in by_inode:
                    packaged = path in observed.packages
                    by_inode[key] = pool.submit(_digests, contents(host, info.st_size), packaged)
                regular.append((path, host, info, xattr, by_inode[key]))
    for path, host, info, xattr, digests in regular:
        sha, md5 = digests.result()
        if md5 is None and path in observed.packages:  # a package's hard link to another file
            sha, md5 = _digests(contents(host, info.st_size), True)
        observed.entries[path] += f" sha256:{sha}{xattr}"
        # Only a package's file (a path no package owns may share its inode, so its digests).
        if md5 is not None and path in observed.packages:
            observed.package_md5[path] = md5
    return observed


class DiskInventory(FrozenModel):
    """The freeze's reading of the frozen disk (``<lab>/disk-inventory.json``); the freeze
    manifest holds its sha256 and its counts."""

    schema_version: Literal[1] = SCHEMA_VERSION
    excludes: tuple[str, ...]
    entries: dict[str, str]
    ctimes: dict[str, int] = Field(description="path -> ctime in ns at the freeze")
    # Package files whose content differed from their package's digest at the freeze (a
    # conffile the deploy configured, a file it patched): path -> "<package> md5 <package's>
    # <found or absent>". Unchanged since, they are frozen state like any other file.
    deviations: dict[str, str]

    @property
    def sha256(self) -> str:
        return sha256_digest(canonical_json(self))


def deviations(observed: Observed) -> dict[str, str]:
    """Package files whose md5 on the disk is not their package's (``absent``: not there)."""
    found: dict[str, str] = {}
    for path, file in sorted(observed.packages.items()):
        md5 = observed.package_md5.get(path, "absent")
        if md5 != file.md5:
            found[path] = f"{file.package} md5 {file.md5} {md5}"
    return found


def inventory_of(observed: Observed, excludes: tuple[str, ...]) -> DiskInventory:
    return DiskInventory(
        excludes=excludes,
        entries=observed.entries,
        ctimes=observed.ctimes,
        deviations=deviations(observed),
    )


def read_disk(disk: MountedDisk, excludes: tuple[str, ...]) -> Observed:
    """The inventory of a lab disk mounted on the host (runner.lab.disk)."""
    return take_inventory(disk.root, excludes, disk.chunks)
