"""The disk half of the audit (runner.verify.disk): every path against the freeze's inventory,
every package file against its package's digest, and the report's cap per kind."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.core.errors import InputError
from runner.core.files import write_model
from runner.freeze.inventory import DiskInventory, Observed, PackageFile, inventory_of
from runner.lab.disk import DiskError
from runner.verify.audit import _disk_beside, _disk_part
from runner.verify.disk import (
    DRIFTS_FILE,
    MAX_PER_KIND,
    DiskCheck,
    DiskDrifts,
    audit_disk,
    disk_drifts,
    load_inventory,
)
from runner.verify.report import Drift
from tests.support.freeze_factory import manifest_of


def file(digit: str, mode: str = "0644") -> str:
    return f"file {mode} 0:0 sha256:{digit * 64}"


MD5 = {name: digit * 32 for name, digit in (("x", "1"), ("y", "2"), ("conf", "3"))}
PACKAGES = {
    "/usr/bin/x": PackageFile("pkg-x", MD5["x"]),
    "/usr/bin/y": PackageFile("pkg-y", MD5["y"]),
    "/etc/x.conf": PackageFile("pkg-x", MD5["conf"], conffile=True),
}
FROZEN = {
    "/etc": "dir 0755 0:0",
    "/etc/a": file("a"),
    "/etc/b": file("b"),
    "/etc/c": file("c"),
    "/etc/l": "symlink 0:0 -> a",
    "/etc/x.conf": file("d"),
    "/usr": "dir 0755 0:0",
    "/usr/bin": "dir 0755 0:0",
    "/usr/bin/x": file("e", "0755"),
    "/usr/bin/y": file("f", "0755"),
}
# At the freeze the deploy had configured pkg-x's conffile: it differed from its package then.
FROZEN_MD5 = {"/usr/bin/x": MD5["x"], "/usr/bin/y": MD5["y"], "/etc/x.conf": "9" * 32}


def frozen() -> DiskInventory:
    return inventory_of(
        Observed(entries=FROZEN, package_md5=FROZEN_MD5, packages=PACKAGES), ("/var/log",)
    )


def now(entries: dict[str, str], package_md5: dict[str, str] | None = None) -> Observed:
    return Observed(
        entries=entries, package_md5={**FROZEN_MD5, **(package_md5 or {})}, packages=PACKAGES
    )


def test_the_frozen_inventory_records_the_configured_conffile_as_a_deviation() -> None:
    assert frozen().deviations == {"/etc/x.conf": f"pkg-x md5 {MD5['conf']} {'9' * 32}"}


def test_an_unchanged_disk_has_no_drift_even_with_a_frozen_deviation() -> None:
    assert list(disk_drifts(frozen(), now(dict(FROZEN)))) == []


def test_each_kind_of_path_drift() -> None:
    entries = dict(FROZEN)
    entries["/etc/new"] = file("0")
    del entries["/etc/b"]
    entries["/etc/c"] = file("c", "0600")
    entries["/etc/l"] = "symlink 0:0 -> elsewhere"
    entries["/etc/a"] = file("a") + " xattr:" + "7" * 64
    assert list(disk_drifts(frozen(), now(entries))) == [
        ("path metadata", Drift(check="disk:/etc/a", expected=file("a"), found=entries["/etc/a"])),
        ("path removed", Drift(check="disk:/etc/b", expected=file("b"), found="absent")),
        ("path metadata", Drift(check="disk:/etc/c", expected=file("c"), found=file("c", "0600"))),
        (
            "path content",
            Drift(check="disk:/etc/l", expected="symlink 0:0 -> a", found=entries["/etc/l"]),
        ),
        ("path added", Drift(check="disk:/etc/new", expected="absent", found=file("0"))),
    ]


def test_a_changed_or_removed_package_file_names_its_package_and_both_md5s() -> None:
    entries = {**FROZEN, "/usr/bin/x": file("0", "0755")}
    del entries["/usr/bin/y"]
    observed = now(entries, {"/usr/bin/x": "0" * 32})
    del observed.package_md5["/usr/bin/y"]
    assert list(disk_drifts(frozen(), observed)) == [
        (
            "package file content",
            Drift(
                check="package:pkg-x/usr/bin/x",
                expected=f"{file('e', '0755')} (md5 {MD5['x']})",
                found=f"{file('0', '0755')} (md5 {'0' * 32})",
            ),
        ),
        (
            "package file removed",
            Drift(
                check="package:pkg-y/usr/bin/y",
                expected=f"{file('f', '0755')} (md5 {MD5['y']})",
                found="absent",
            ),
        ),
    ]  # one drift per path: the digest check does not repeat them


def test_a_package_digest_that_no_longer_matches_with_the_entry_unchanged() -> None:
    """The file as frozen, but dpkg's md5sums of its package now say otherwise (that list is
    an entry of its own and drifts too; this names the file it speaks of)."""
    rewritten = {**PACKAGES, "/usr/bin/y": PackageFile("pkg-y", "8" * 32)}
    observed = Observed(entries=dict(FROZEN), package_md5=dict(FROZEN_MD5), packages=rewritten)
    assert list(disk_drifts(frozen(), observed)) == [
        (
            "package digest",
            Drift(
                check="package:pkg-y/usr/bin/y",
                expected=f"md5 {'8' * 32} (package pkg-y's)",
                found=f"md5 {MD5['y']}",
            ),
        )
    ]
    # The frozen deviation counts only as it was: the conffile changed again is a drift.
    again = now(dict(FROZEN), {"/etc/x.conf": "6" * 32})
    [(kind, drift)] = disk_drifts(frozen(), again)
    assert (kind, drift.check, drift.found) == (
        "package digest",
        "package:pkg-x/etc/x.conf",
        f"md5 {'6' * 32}",
    )


def test_the_report_keeps_the_first_of_each_kind_and_the_evidence_every_drift(
    tmp_path: Path,
) -> None:
    added = {f"/srv/new/{n:03d}": file("0") for n in range(MAX_PER_KIND + 5)}
    entries = {**FROZEN, **added}
    for removed in ("/etc/a", "/etc/b"):
        del entries[removed]
    check = DiskCheck(inventory=frozen(), read=lambda captured: now(entries))
    checks, kept, paths = audit_disk(check, tmp_path, lambda: None)

    assert paths == len(entries)
    assert checks == ["disk:/etc", "disk:/srv", "disk:/usr", "package:pkg-x", "package:pkg-y"]
    by_check = [drift.check for drift in kept]
    assert by_check == [
        *(f"disk:{path}" for path in sorted(added)[:MAX_PER_KIND]),
        "disk:(path added: 5 more)",
        "disk:/etc/a",
        "disk:/etc/b",
    ]
    more = kept[MAX_PER_KIND]
    assert more.expected == f"the first {MAX_PER_KIND} are listed"
    assert more.found == f"{MAX_PER_KIND + 5} in all, every one in {tmp_path / DRIFTS_FILE}"
    every = DiskDrifts.model_validate_json((tmp_path / DRIFTS_FILE).read_bytes())
    assert len(every.drifts) == MAX_PER_KIND + 5 + 2
    assert {d.check for d in every.drifts} == {f"disk:{p}" for p in [*added, "/etc/a", "/etc/b"]}


def test_a_clean_disk_still_writes_its_empty_evidence(tmp_path: Path) -> None:
    checks, kept, _ = audit_disk(
        DiskCheck(frozen(), lambda captured: now(dict(FROZEN))), tmp_path, lambda: None
    )
    assert kept == [] and "package:pkg-y" in checks
    assert json.loads((tmp_path / DRIFTS_FILE).read_text()) == {"drifts": []}


def test_a_disk_that_could_not_be_read_is_a_drift_not_a_crash(tmp_path: Path) -> None:
    def unreadable(captured: Callable[[], None]) -> Observed:
        raise DiskError("qemu-storage-daemon: no such layer")

    failed = threading.Event()
    checks, drifts, paths, seconds = _disk_part(DiskCheck(frozen(), unreadable), tmp_path, failed)
    assert (checks, paths) == (["disk:read"], 0) and seconds >= 0
    assert failed.is_set()  # the audit's guest side is not left waiting for a moment never taken
    assert drifts == [
        Drift(
            check="disk:read",
            expected="the disk read on the host",
            found="qemu-storage-daemon: no such layer",
        )
    ]


def test_the_guest_side_starts_once_the_disks_moment_is_taken_and_runs_beside_its_read(
    tmp_path: Path,
) -> None:
    """The audit's guest side waits for the disk's copy (the guest is frozen until then), then
    runs while the host still reads that copy: here the read cannot end until it has."""
    guest_side = threading.Event()
    order: list[str] = []

    def read(captured: Callable[[], None]) -> Observed:
        order.append("moment taken")
        captured()
        assert guest_side.wait(30), "the guest side did not start beside the disk's read"
        order.append("read")
        return now(dict(FROZEN))

    with _disk_beside(DiskCheck(frozen(), read), tmp_path) as disk_part:
        order.append("guest side")
        guest_side.set()
        checks, drifts, paths, _ = disk_part()
    assert order == ["moment taken", "guest side", "read"]
    assert drifts == [] and paths == len(FROZEN) and "package:pkg-x" in checks


def test_without_a_disk_the_guest_side_alone_runs(tmp_path: Path) -> None:
    with _disk_beside(None, tmp_path) as disk_part:
        assert disk_part() == ([], [], 0, None)


def test_the_inventory_must_be_the_manifests_own(tmp_path: Path) -> None:
    entries = {"/etc": "dir 0755 0:0"}
    collected = {"kernel": "k", "packages": {}, "images": [], "listening": []}
    manifest = manifest_of({}, collected, entries=entries)
    path = tmp_path / "disk-inventory.json"
    write_model(path, inventory_of(Observed(entries=entries), ("/var/log",)))
    assert load_inventory(path, manifest).entries == entries
    write_model(path, inventory_of(Observed(entries={"/etc": "dir 0700 0:0"}), ("/var/log",)))
    with pytest.raises(InputError, match="is not the disk inventory of freeze"):
        load_inventory(path, manifest)
