"""Every archive the suite accepts is read alike by the check, GNU tar and Python's tarfile (#34
item 1): the same members, in the same order, with the same bytes."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

from runner.archive.check import Verdict, check_archive
from runner.archive.tar_format import Member, read_members
from runner.report.signing import PublicKey


class _Kept(io.BytesIO):
    def close(self) -> None:  # the reader closes each member's handle; its bytes stay
        pass


def strict_members(tarball: Path) -> list[tuple[str, bytes]]:
    """The members and their bytes as the check reads them (runner.archive.tar_format)."""
    read: dict[str, _Kept] = {}

    def take(member: Member) -> _Kept:
        read[member.name] = _Kept()
        return read[member.name]

    names = [member.name for member in read_members(tarball, take)]
    return [(name, read[name].getvalue()) for name in names]


def every_reader_agrees(tarball: Path) -> list[tuple[str, bytes]]:
    """The check's members and bytes are GNU tar's and tarfile's, in the same order."""
    read = strict_members(tarball)
    listed = subprocess.run(
        ["tar", "--quoting-style=literal", "-tzvf", str(tarball)],
        capture_output=True,
        encoding="utf-8",
        check=True,
    )
    assert listed.stderr == ""
    assert [line.split(maxsplit=5)[2::3] for line in listed.stdout.splitlines()] == [
        [str(len(data)), name] for name, data in read
    ]
    with tempfile.TemporaryDirectory(prefix="gnu-tar-") as scratch:
        unpacked = Path(scratch)
        done = subprocess.run(["tar", "-xzf", str(tarball), "-C", scratch], capture_output=True)
        assert (done.returncode, done.stderr) == (0, b"")
        files = sorted(p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*"))
        assert [f for f in files if (unpacked / f).is_file()] == sorted(name for name, _ in read)
        assert all((unpacked / name).read_bytes() == data for name, data in read)
    with tarfile.open(tarball) as tar:
        python = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert python == read
    return read


def intact(tarball: Path, pinned_key: PublicKey | None = None) -> Verdict:
    """``check_archive``'s verdict on an archive it accepts, which every reader reads alike."""
    verdict = check_archive(tarball, pinned_key)
    every_reader_agrees(tarball)
    return verdict
