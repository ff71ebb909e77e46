"""Unpacking tar archives safely on every Python the tool runs on.

tarfile's ``filter="data"`` (Python >= 3.11.4) is not in Debian 12's Python 3.11.2, which the
project's venv is made from; this does the same checks by hand: only files, directories and
links that stay inside the target, no special bits, no device nodes.
"""

from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path

from runner.core.errors import RunnerError

_PERMISSION_BITS = 0o755  # no setuid/setgid/sticky, no group/other write (as the data filter)


class UnsafeArchive(RunnerError):
    """A member would land outside the target, or is not a file, directory or link."""


def _inside(name: str) -> bool:
    normal = posixpath.normpath(name)
    return not (normal.startswith("/") or normal == ".." or normal.startswith("../"))


def checked_member(member: tarfile.TarInfo, fixed_modes: bool = False) -> tarfile.TarInfo:
    """The member as it may be unpacked, or ``UnsafeArchive``; ``fixed_modes``: 0755 for
    directories and executables, 0644 for other files, whatever the archive says."""
    if not _inside(member.name):
        raise UnsafeArchive(f"archive member {member.name!r} lies outside the target")
    if member.issym() and not _inside(
        posixpath.join(posixpath.dirname(member.name), member.linkname)
    ):
        raise UnsafeArchive(f"archive link {member.name!r} points outside the target")
    if member.islnk() and not _inside(member.linkname):
        raise UnsafeArchive(f"archive link {member.name!r} points outside the target")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"archive member {member.name!r} is not a file, directory or link")
    if fixed_modes and (member.isdir() or member.isfile()):
        member.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
    else:
        member.mode &= _PERMISSION_BITS
    return member


def extract(archive: tarfile.TarFile, target: Path, fixed_modes: bool = False) -> None:
    """Every member of ``archive`` under ``target``, checked first (nothing is written when one
    member is unsafe)."""
    members = [checked_member(member, fixed_modes) for member in archive.getmembers()]
    if hasattr(tarfile, "fully_trusted_filter"):  # checked above; newer Pythons want a filter
        archive.extractall(target, members=members, filter="fully_trusted")
    else:
        archive.extractall(target, members=members)
