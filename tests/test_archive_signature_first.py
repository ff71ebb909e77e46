"""Signature first, then bounded work (#34 item 2): ``runner check-archive`` verifies the signed
manifest before it reads any other member, and every read after draws from one budget for the
whole archive, set by constants and the signed manifest, never by unsigned bytes. Each case of
the issue's "Work before the signature" is here at a small scale (the caps scaled down where a
realistic case would take GiBs): one verdict line, exit 1, and the work it took bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import runner.archive.tarball as archive_module
from runner.archive.tar_format import BLOCK, Budget, Spend, read_members, stream_bound
from runner.archive.tarball import MAX_RECORD_BYTES, MAX_SIGNATURE_BYTES, unpack, write_archive
from runner.cli.main import cli
from runner.core.errors import InputError
from runner.records.paths import RunPaths
from tests.support.hostile_archives import (
    copy_of,
    declaring_huge_size,
    ended,
    gzipped,
    header,
    huge_pax_first,
    manifest_listing_zeros,
    members_end,
    members_of,
    nested_gzip,
    packed,
    tar_stream,
)
from tests.test_archive_strict import key  # noqa: F401  (a fixture)
from tests.test_evidence_archive import archive, finished_run, operator_cache  # noqa: F401  (fixtures)

PRE_SIGNATURE = stream_bound([MAX_RECORD_BYTES, MAX_SIGNATURE_BYTES])


def one_verdict(tarball: Path, key: Path) -> str:  # noqa: F811
    """The CLI's whole output on ``tarball`` (in this process, so a scaled cap holds): one
    verdict line, exit 1."""
    done = CliRunner().invoke(cli, ["check-archive", str(tarball), "--key", str(key)])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    assert done.exit_code == 1, done.output
    [line] = done.output.splitlines()
    assert line.startswith("archive BROKEN: ")
    return line.removeprefix("archive BROKEN: ")


@pytest.fixture
def spent(monkeypatch: pytest.MonkeyPatch) -> dict[Spend, int]:
    """What every archive reading in the test drew from its budget, all readings together."""
    total: dict[Spend, int] = {"inflated": 0, "members": 0, "unpacked": 0}
    draw = Budget.draw

    def counted(budget: Budget, what: Spend, amount: int) -> str | None:
        over = draw(budget, what, amount)
        total[what] += 0 if over else amount
        return over

    monkeypatch.setattr(Budget, "draw", counted)
    return total


def test_a_forged_manifest_is_refused_before_any_member_is_read_or_written(
    archive: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
    spent: dict[Spend, int],
) -> None:
    """The issue's 2.26 MB archive that wrote 2 GiB before its signature was found wrong: the
    unsigned manifest lists a big member (32 MiB of zeros here, 32 KiB gzipped); the signature
    is refused with the manifest and its signature read, nothing of the member inflated and
    nothing written."""
    members = members_of(archive)
    forged = manifest_listing_zeros(archive, tmp_path / "forged.tar.gz", 32 << 20)
    forged_manifest = members_of(forged)[0][1]
    assert forged.stat().st_size < 1 << 20
    tree = tmp_path / "tree"
    with pytest.raises(InputError) as raised:
        unpack(forged, tree)
    assert str(raised.value).startswith(
        "archive-manifest.sig: not the signature of archive-manifest.json by the key it names"
    )
    assert not tree.exists()
    assert spent["members"] == 2 and spent["unpacked"] == len(forged_manifest) + len(members[1][1])
    assert spent["inflated"] < len(forged_manifest) + 8 * BLOCK + (64 << 10) < PRE_SIGNATURE
    assert one_verdict(forged, key).startswith(
        "archive-manifest.sig: not a signature of archive-manifest.json by the pinned key"
    )


@pytest.mark.parametrize("size", [2 << 30, 16 << 30], ids=["2GiB", "16GiB-pax"])
def test_a_member_declaring_a_huge_size_is_refused_from_its_header(
    archive: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
    size: int,
    spent: dict[Spend, int],
) -> None:
    """The 2 GiB sparse member read whole (37-50 s): the genuine archive's last member
    declares a huge size (a sparse file's apparent size, say) and no data follows. Its size is
    drawn from the signed manifest's budget before a byte of it is read, and refused there."""
    members = members_of(archive)
    name = members[-1][0]
    out, at = declaring_huge_size(archive, tmp_path / "huge.tar.gz", size)
    listed = sum(len(data) for _, data in members)
    assert one_verdict(out, key) == (
        f"{out}: at byte {at} of the tar stream, member {name!r} of {size} B is over the cap of "
        f"{listed} B of members (what the signed manifest lists)"
    )
    assert spent["unpacked"] == listed - len(members[-1][1])  # the refused member drew nothing


def test_one_member_more_than_the_signed_manifest_lists_is_refused_at_its_header(
    archive: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Too many members: the count is the signed manifest's; the first member over it is refused
    from its header, the thousand after it never read."""
    stream = tar_stream(archive)
    end = members_end(stream)
    extra = b"".join(header(f"run/extra-{n}", 0) for n in range(1000))
    out = tmp_path / "many.tar.gz"
    out.write_bytes(gzipped(ended(stream[:end] + extra)))
    count = len(members_of(archive))
    assert one_verdict(out, key) == (
        f"{out}: at byte {end} of the tar stream, member 'run/extra-0' of 0 B is over the cap "
        f"of {count} members (what the signed manifest lists)"
    )


def test_a_member_the_signed_manifest_does_not_list_is_refused_before_it_is_written(
    archive: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """In place of a genuine member, at the same count: refused by name, and what was
    unpacked before it removed."""
    members = members_of(archive)
    forged = packed(tmp_path / "swapped.tar.gz", [*members[:-1], ("run/planted.bin", b"x")])
    assert one_verdict(forged, key) == f"{forged}: member 'run/planted.bin' is not in the manifest"
    tree = tmp_path / "tree"
    with pytest.raises(InputError, match="is not in the manifest"):
        unpack(forged, tree)
    assert list(tree.iterdir()) == []


def test_a_huge_pax_header_before_the_manifest_is_refused_from_its_header(
    archive: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A 256 MiB pax header as the first header of all (934 MB of memory before any check):
    refused from its header block by the constant cap, before the signature is even read."""
    out = huge_pax_first(tmp_path / "pax-first.tar.gz", 256 << 20)
    assert one_verdict(out, key) == (
        f"{out}: at byte 124 of the tar stream, a pax header of {256 << 20} B (at most 8192 B)"
    )


def test_the_tar_stream_is_read_within_the_budget_it_is_given(archive: Path) -> None:  # noqa: F811
    """The mechanism itself: a reading given fewer bytes to inflate than the archive holds stops
    at the cap, having inflated at most one byte more."""
    cap = len(tar_stream(archive)) // 2
    budget = Budget({"inflated": cap, "members": 1000, "unpacked": 1 << 30}, "a test's cap")
    with pytest.raises(InputError) as raised:
        read_members(archive, budget=budget)
    assert str(raised.value) == (
        f"{archive}: at byte {cap} of the tar stream, the stream goes on, over the cap of {cap} "
        "B inflated (a test's cap)"
    )
    assert budget.spent["inflated"] <= cap


def test_gzip_in_gzip_members_draw_from_one_budget_for_the_whole_archive(
    finished_run: Path,  # noqa: F811
    key: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two small gzip-in-gzip members each under the per-file cap (4 GiB each: 149 s, 95 s of
    CPU in the issue): together over the whole archive's (scaled to 8 MiB here), the second is
    a finding of the scan."""
    copy = copy_of(finished_run, tmp_path)
    trial = next(RunPaths(copy).trials_dir.glob("*/trial-1"))
    for name in ("a.gz", "b.gz"):
        (trial / name).write_bytes(nested_gzip(5 << 20))
    out = tmp_path / "bombs.tar.gz"
    write_archive(copy, out)  # under the constant cap: archived
    monkeypatch.setattr(archive_module, "MAX_SCAN_INFLATED_BYTES", 8 << 20)
    said = one_verdict(out, key)
    assert (
        said.startswith("credential scan: run/trials/") and "/trial-1/b.gz cannot be read" in said
    )
    assert "bytes inflated (the cap for the whole archive)" in said
