"""Safe tar unpacking on Debian 12's Python 3.11.2 (no tarfile filters there)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from runner.core.archives import UnsafeArchive, extract


def archive_of(*members: tuple[tarfile.TarInfo, bytes]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r")


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def test_files_directories_and_inner_links_unpack_without_special_bits(tmp_path: Path) -> None:
    archive = archive_of(
        (entry("trial", tarfile.DIRTYPE, 0o777), b""),
        (entry("trial/result.json", mode=0o4777), b"{}"),
        (entry("trial/latest", tarfile.SYMTYPE, link="result.json"), b""),
    )
    extract(archive, tmp_path)
    assert (tmp_path / "trial/result.json").read_text() == "{}"
    assert (tmp_path / "trial/result.json").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "trial/latest").resolve() == (tmp_path / "trial/result.json").resolve()


def test_fixed_modes_whatever_the_archive_says(tmp_path: Path) -> None:
    archive = archive_of(
        (entry("pkg", tarfile.DIRTYPE, 0o700), b""),
        (entry("pkg/run.sh", mode=0o700), b"#!/bin/sh\n"),
        (entry("pkg/README", mode=0o600), b"hi"),
    )
    extract(archive, tmp_path, fixed_modes=True)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "pkg").iterdir()}
    assert modes == {"run.sh": 0o755, "README": 0o644}
    assert (tmp_path / "pkg").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        (entry("../escape"), "lies outside the target"),
        (entry("/etc/passwd"), "lies outside the target"),
        (entry("a/../../escape"), "lies outside the target"),
        (entry("link", tarfile.SYMTYPE, link="../../etc/passwd"), "points outside the target"),
        (entry("hard", tarfile.LNKTYPE, link="../outside"), "points outside the target"),
        (entry("dev", tarfile.CHRTYPE), "is not a file, directory or link"),
        (entry("fifo", tarfile.FIFOTYPE), "is not a file, directory or link"),
    ],
)
def test_unsafe_members_are_refused_before_anything_is_written(
    tmp_path: Path, member: tarfile.TarInfo, problem: str
) -> None:
    archive = archive_of((entry("first.txt"), b"x"), (member, b""))
    with pytest.raises(UnsafeArchive, match=problem):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()
