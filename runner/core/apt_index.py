"""A flat apt repository's ``Packages`` index (``deb [trusted=yes] URL ./``) made from .deb files:
each file's own control fields (its control file as python-debian reads it: what ``dpkg-deb -f``
prints, without a process per file) with where it lies, its size and sha256. The
lab's mirror serves one to the guest; images.base gives one to mmdebstrap on the host."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from debian.debfile import DebFile as DebArchive

from runner.core.errors import RunnerError


@dataclass(frozen=True)
class DebFile:
    path: Path  # the bytes (the artifact store's blob)
    filename: str  # its name in the repository
    size: int
    sha256: str  # "sha256:<hex>"


def packages_index(debs: Iterable[DebFile]) -> bytes:
    """The index, its stanzas in file name order: the same files give the same bytes."""
    stanzas = []
    for deb in sorted(debs, key=lambda item: item.filename):
        control = _control(deb.path)
        stanzas.append(
            f"{control}\nFilename: ./{deb.filename}\nSize: {deb.size}\n"
            f"SHA256: {deb.sha256.removeprefix('sha256:')}\n"
        )
    return "\n".join(stanzas).encode()


def _control(path: Path) -> str:
    with DebArchive(str(path)) as archive:
        control = archive.control.get_content("control", encoding="utf-8")
    if control is None:
        raise RunnerError(f"{path}: a .deb without a control file")
    return control.strip()


# apt wants a Date; a fixed one keeps the same index the same bytes.
RELEASE_DATE = "Thu, 01 Jan 1970 00:00:00 UTC"


def release_file(packages: bytes, suite: str, label: str) -> bytes:
    """The repository's Release (unsigned: the source line says ``trusted=yes``); ``suite`` is
    its Suite and Codename, by which mmdebstrap picks a suite's Essential set."""
    digest = hashlib.sha256(packages).hexdigest()
    return (
        f"Origin: frozen-bench\nLabel: {label}\nSuite: {suite}\nCodename: {suite}\n"
        f"Date: {RELEASE_DATE}\nSHA256:\n {digest} {len(packages)} Packages\n"
    ).encode()
