"""One reading of the archive (#34 item 1): ``runner check-archive`` accepts only the gzip and
tar subset ``runner archive`` writes (runner.archive.tar_format), so what it checked is what
GNU tar and Python's tarfile unpack. Each forgery below was read one way by the check and
another by tar (or ended the check in a traceback); each is now refused in one line naming the
byte offset, the verdict the output's last line, exit 1.
"""

from __future__ import annotations

import gzip
import subprocess
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import runner.cli.check_archive as check_archive_cli
from runner.archive.check import ArchiveBroken, check_archive
from runner.archive.tar_format import BLOCK
from runner.archive.tarball import write_archive
from runner.cli.main import cli
from runner.records.paths import RunPaths
from tests.support.archive_readers import every_reader_agrees
from tests.support.hostile_archives import (
    FORGED_LEDGER,
    bad_checksum_block,
    copy_of,
    ended,
    forged_after,
    gzipped,
    header,
    huge_pax_after,
    junk_devmajor,
    member,
    members_end,
    sparse_map,
    tar_stream,
)
from tests.test_evidence_archive import archive, finished_run, operator_cache  # noqa: F401  (fixtures)
from tests.test_report_cli import runner_cli


def refused(tarball: Path, key: Path, said: str) -> str:
    """The CLI's verdict on ``tarball``: exit 1, the last line names the refusal, no
    traceback; ``said`` is what follows the archive's name."""
    done = runner_cli("check-archive", str(tarball), "--key", str(key))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last == f"archive BROKEN: {tarball}: {said}", last
    return last


@pytest.fixture(scope="module")
def key(finished_run: Path) -> Path:  # noqa: F811
    return RunPaths(finished_run).receipt_public_key


def test_every_reader_reads_the_genuine_archive_as_the_check(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    read = every_reader_agrees(archive)
    assert read[0][0] == "run/archive-manifest.json" and len(read) > 30
    done = runner_cli("check-archive", str(archive), "--key", str(key))
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("archive intact")


def test_long_and_non_ascii_names_go_in_a_pax_header_every_reader_reads(
    finished_run: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    copy = copy_of(finished_run, tmp_path)
    long_name = "l" * 150 + ".txt"
    (RunPaths(copy).verify_dir / long_name).write_text("long\n")
    (RunPaths(copy).verify_dir / "résumé.txt").write_text("non-ASCII\n")
    out = tmp_path / "pax.tar.gz"
    write_archive(copy, out)
    assert b"path=run/verify/" + long_name.encode() in tar_stream(out)
    read = dict(every_reader_agrees(out))
    assert read["run/verify/résumé.txt"] == b"non-ASCII\n"
    assert check_archive(out, None).cells == 4  # and every reader agreed above


def test_a_header_with_junk_devmajor_hides_forged_members_from_tarfile(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    """tarfile ends the archive at the junk header; GNU tar ignores the field and unpacks the
    forged report and ledger over the genuine ones."""
    forged, at = junk_devmajor(archive, tmp_path / "devmajor.tar.gz")
    with tarfile.open(archive) as genuine, tarfile.open(forged) as python:
        assert len(python.getmembers()) == len(genuine.getmembers())
    listed = subprocess.run(["tar", "-tzf", str(forged)], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.splitlines()[-2:] == [
        "run/report.md",
        "run/cells.jsonl",
    ]
    refused(
        forged,
        key,
        f"at byte {at + 329} of the tar stream, the header's devmajor field is "
        "b'junk\\x00\\x00\\x00\\x00', `runner archive` writes b'\\x00\\x00\\x00\\x00\\x00\\x00"
        "\\x00\\x00'",
    )


def test_a_bad_checksum_block_before_forged_members_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    """GNU tar warns 'Skipping to next header' and unpacks what follows; tarfile stops."""
    forged, at = bad_checksum_block(archive, tmp_path / "checksum.tar.gz")
    listed = subprocess.run(["tar", "-tzf", str(forged)], capture_output=True, text=True)
    assert "Skipping to next header" in listed.stderr and "run/cells.jsonl" in listed.stdout
    refused(
        forged,
        key,
        f"at byte {at} of the tar stream, a header's checksum field b'JJJJJJJJ' is not its sum "
        f"{sum(b'J' * 148) + 8 * 0x20 + sum(b'J' * 356):o}",
    )


@pytest.mark.parametrize("where", ["after-one-zero-block", "after-the-record"])
def test_data_after_the_end_of_archive_blocks_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
    where: str,
) -> None:
    """After one zero block GNU tar warns of a lone zero block and stops, with -i it reads on;
    after the end (two zero blocks, the record's padding) it reads on with -i; neither is
    written by `runner archive`."""
    stream = tar_stream(archive)
    end = members_end(stream)
    forged = member("run/cells.jsonl", FORGED_LEDGER)
    if where == "after-one-zero-block":
        at = end + BLOCK
        stream = ended(stream[:at] + forged)
        said = "a non-zero byte in the end-of-archive blocks and the record's zero padding"
    else:
        at = len(stream)
        stream = ended(stream + forged)
        said = "data follows the end of the archive"
    out = tmp_path / "after.tar.gz"
    out.write_bytes(gzipped(stream))
    if where == "after-one-zero-block":
        listed = subprocess.run(["tar", "-tzf", str(out)], capture_output=True, text=True)
        assert "A lone zero block" in listed.stderr
    read_on = subprocess.run(["tar", "-itzf", str(out)], capture_output=True, text=True)
    assert read_on.stdout.splitlines()[-1] == "run/cells.jsonl"
    refused(out, key, f"at byte {at} of the tar stream, {said}")


def test_a_second_gzip_member_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    """gzip and GNU tar read a second member as more of the stream (with -i, its members)."""
    genuine = archive.read_bytes()
    out = tmp_path / "two.tar.gz"
    out.write_bytes(genuine + gzipped(ended(member("run/cells.jsonl", FORGED_LEDGER))))
    assert gzip.decompress(out.read_bytes()).endswith(bytes(BLOCK))  # readable as one stream
    refused(
        out,
        key,
        f"at byte {len(genuine)} of the file, data follows the gzip member (a second member or "
        "junk)",
    )


def fextra(data: bytes) -> bytes:
    return data[:3] + b"\x04" + data[4:10] + b"\x04\x00abcd" + data[10:]


def fname(data: bytes) -> bytes:
    return data[:3] + b"\x08" + data[4:10] + b"forged.tar\x00" + data[10:]


def os_unix(data: bytes) -> bytes:
    return data[:9] + b"\x03" + data[10:]


def mtime(data: bytes) -> bytes:
    return data[:4] + b"\x01" + data[5:]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (os_unix, "at byte 9 of the file, the gzip header's OS byte is 0x03"),
        (fextra, "at byte 3 of the file, the gzip header's FLG byte is 0x04"),
        (fname, "at byte 3 of the file, the gzip header's FLG byte is 0x08"),
        (mtime, "at byte 4 of the file, the gzip header's MTIME byte is 0x01"),
    ],
    ids=["os", "fextra", "fname", "mtime"],
)
def test_a_gzip_header_runner_archive_does_not_write_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
    edit: Callable[[bytes], bytes],
    said: str,
) -> None:
    out = tmp_path / "header.tar.gz"
    out.write_bytes(edit(archive.read_bytes()))
    assert gzip.decompress(out.read_bytes()) == tar_stream(archive)  # gzip reads it alike
    written = "0x00" if edit is not os_unix else "0xff"
    refused(out, key, f"{said}, `runner archive` writes {written}")


def test_a_gnu_sparse_map_in_a_pax_header_is_refused_without_a_traceback(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    forged, at = sparse_map(archive, tmp_path / "sparse-map.tar.gz")
    refused(
        forged,
        key,
        f"at byte {at + BLOCK} of the tar stream, pax key 'GNU.sparse.map': `runner archive` "
        "writes only 'path' and 'size', once each",
    )


def test_a_gnu_sparse_member_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    forged, at = forged_after(
        archive, tmp_path / "sparse.tar.gz", member("run/cells.jsonl", FORGED_LEDGER, typeflag=b"S")
    )
    refused(
        forged,
        key,
        f"at byte {at} of the tar stream, typeflag b'S': `runner archive` writes regular files "
        "('0'), each with at most one pax header ('x') before it",
    )


def test_a_huge_pax_header_is_refused_by_the_cap_before_it_is_read(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
) -> None:
    """A pax header of 256 MiB (a comment, gzipped to a few hundred KiB): refused from its
    header block, its records never held in memory."""
    size = 256 << 20
    out, end = huge_pax_after(archive, tmp_path / "huge.tar.gz", size)
    assert out.stat().st_size < 1 << 20
    said = f"at byte {end + 124} of the tar stream, a pax header of {size} B (at most 8192 B)"
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveBroken) as raised:
            check_archive(out, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(raised.value) == f"{out}: {said}"
    assert peak < 8 << 20
    refused(out, key, said)


@pytest.mark.parametrize(
    ("typeflag", "link"),
    [(b"2", b"/etc/passwd"), (b"1", b"run/receipt.json")],
    ids=["symlink", "hardlink"],
)
def test_a_link_member_is_refused(
    archive: Path,  # noqa: F811
    key: Path,
    tmp_path: Path,
    typeflag: bytes,
    link: bytes,
) -> None:
    forged, at = forged_after(
        archive,
        tmp_path / "link.tar.gz",
        header("run/trials/escape", 0, typeflag=typeflag, linkname=link),
    )
    refused(
        forged,
        key,
        f"at byte {at} of the tar stream, typeflag {typeflag!r}: `runner archive` writes regular "
        "files ('0'), each with at most one pax header ('x') before it",
    )


def test_an_error_no_link_foresaw_still_ends_in_a_verdict(
    archive: Path,  # noqa: F811
    key: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever a malformed archive raises, the output's last line is the verdict (#34 item 5)."""

    def unforeseen(archive: Path, pinned: object) -> None:
        raise ValueError("invalid literal for int() with base 10: 'junk'\nsecond line")

    monkeypatch.setattr(check_archive_cli, "check_archive", unforeseen)
    done = CliRunner().invoke(cli, ["check-archive", str(archive), "--key", str(key)])
    assert (done.exit_code == 1 and done.exception is None) or isinstance(
        done.exception, SystemExit
    )
    assert done.output.splitlines()[-1] == (
        "archive BROKEN: the check stopped on what it read (ValueError: invalid literal for "
        "int() with base 10: 'junk'\\nsecond line)"
    )
