"""The credential scan opens what the guest's own tools open and decodes what they decode: each
evasion of #34 ("Scan evasion") built as an agent would, with the tools where there is one, and
found; a file that only begins like a container searched as bytes, with why, never a failure."""

from __future__ import annotations

import base64
import gzip
import json
import random
import urllib.parse
import zlib
from pathlib import Path

import pytest

from runner.core.files import read_model
from runner.freeze.inventory import DiskInventory
from runner.records.paths import RunPaths
from runner.scan import layers
from runner.scan.guest_disk import GuestScan, record_guest_scan, scan_disk
from runner.scan.layers import InflateBudget
from runner.scan.scan import ScanReport, scan, scan_run
from tests.support.scan_evasions import EVASIONS, KEY, LINE, deb, percent, u_escapes

SECRETS = {"provider_key": [KEY]}


@pytest.mark.parametrize("build", EVASIONS.values(), ids=EVASIONS)
def test_an_evasive_file_is_found(tmp_path: Path, build: object) -> None:
    root = tmp_path / "kept"
    root.mkdir()
    (root / "evasive").write_bytes(build(tmp_path))  # type: ignore[operator]
    report = scan([root], SECRETS, base=root)  # type: ignore[arg-type]
    assert "bearer" in {leak.kind for leak in report.leaks}, report
    assert not report.failures


WITH_THE_KEY = {
    "hex": KEY.encode().hex().upper().encode(),
    "%XX": percent(KEY),
    "%XX among plain characters": urllib.parse.quote(KEY, safe="").replace("-", "%2D").encode(),
    "zlib": zlib.compress(KEY.encode()),
    "\\u escapes": u_escapes(KEY),
}


@pytest.mark.parametrize("data", WITH_THE_KEY.values(), ids=WITH_THE_KEY)
def test_the_real_key_is_found_in_its_encodings(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "kept.bin").write_bytes(data)
    report = scan([tmp_path], SECRETS, base=tmp_path)  # type: ignore[arg-type]
    assert [leak.kind for leak in report.leaks] == ["provider_key"]


def test_a_layer_names_where_it_was_found(tmp_path: Path) -> None:
    (tmp_path / "leak.deb").write_bytes(deb(tmp_path / "x"))
    report = scan([tmp_path / "leak.deb"], SECRETS, base=tmp_path)  # type: ignore[arg-type]
    assert ("provider_key", "data.tar.xz!xz!./etc/agent.env") in {
        (leak.kind, leak.inside) for leak in report.leaks
    }


# Files that begin like a container and are none: searched as bytes, the reason recorded.
SPURIOUS = {
    "gzip header, then random": (b"\x1f\x8b\x08\x00" + bytes(6), "gzip"),
    "zip local header, then random": (
        b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(16) + b"\x05\x00\x00\x00",
        "zip",
    ),
    "ar magic, then text": (b"!<arch>\nnot an archive at all, just text\n" * 3, "ar"),
    "cpio magic, then text": (b"070701 is a number in this log\n", "cpio"),
    "zlib header, then random": (b"\x78\x9c", "zlib"),
    "bzip2 magic alone": (b"BZh9", "bzip2"),
}


@pytest.mark.parametrize("head, kind", SPURIOUS.values(), ids=SPURIOUS)
def test_a_binary_that_only_begins_like_a_container_is_searched_as_bytes_with_why(
    tmp_path: Path, head: bytes, kind: str
) -> None:
    data = head + random.Random(3).randbytes(3000) + LINE
    (tmp_path / "blob.bin").write_bytes(data)
    report = scan([tmp_path], SECRETS, base=tmp_path)  # type: ignore[arg-type]
    assert report.failures == ()
    assert {leak.kind for leak in report.leaks} == {"provider_key", "bearer"}
    assert [(entry.file, entry.layer) for entry in report.searched_as_bytes] == [("blob.bin", None)]
    assert kind in report.searched_as_bytes[0].reason


def test_random_binaries_are_no_containers_and_inflate_nothing_much(tmp_path: Path) -> None:
    """A disk's worth of binaries and text: raw deflate's probe (any layer may be one) and the
    weak headers (zlib's two bytes) turn none into a failure, none into a big inflate."""
    rng = random.Random(34)
    for index in range(400):
        body = rng.randbytes(rng.randrange(1, 20_000))
        (tmp_path / f"{index}.bin").write_bytes(body)
        (tmp_path / f"{index}.json").write_text(json.dumps({"step": index, "text": body.hex()}))
    budget = InflateBudget()
    report = scan([tmp_path], SECRETS, base=tmp_path, budget=budget)  # type: ignore[arg-type]
    assert (report.failures, report.leaks) == ((), ())
    assert budget.cap - budget.left < 4 << 20
    assert all("deflate" not in entry.reason for entry in report.searched_as_bytes)


def test_one_inflate_budget_for_the_whole_scan_and_its_cap_is_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers, "MAX_INFLATED_BYTES", 8 << 20)
    for name in ("a.gz", "b.gz"):  # each under the cap, together over it
        (tmp_path / name).write_bytes(gzip.compress(b"\x00" * (5 << 20)))
    report = scan([tmp_path], SECRETS, base=tmp_path)  # type: ignore[arg-type]
    assert [failure.file for failure in report.failures] == ["b.gz"]
    assert f"more than {8 << 20} bytes inflated" in report.failures[0].error


def test_a_torn_container_in_base64_is_searched_as_far_as_it_goes(tmp_path: Path) -> None:
    torn = base64.b64encode(gzip.compress(LINE + bytes(range(256)) * 40)[:-30])
    (tmp_path / "blob.json").write_bytes(b'{"gz": "' + torn + b'"}')
    report = scan([tmp_path], SECRETS, base=tmp_path)  # type: ignore[arg-type]
    assert {leak.kind for leak in report.leaks} == {"provider_key", "bearer"}
    assert report.failures == ()
    assert [entry.layer for entry in report.searched_as_bytes] == ["base64"]


def test_searched_as_bytes_is_kept_in_scan_json_and_the_guest_scan(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir(parents=True)
    (paths.run_dir / "odd.bin").write_bytes(b"\x1f\x8b\x07" + bytes(40))
    report = scan_run(paths, SECRETS)  # type: ignore[arg-type]
    on_disk = read_model(paths.scan, ScanReport)
    assert on_disk.searched_as_bytes == report.searched_as_bytes
    assert [entry.file for entry in on_disk.searched_as_bytes] == ["odd.bin"]

    guest = tmp_path / "guest"
    (guest / "root").mkdir(parents=True)
    (guest / "root" / "odd.bin").write_bytes(b"BZh9" + bytes(40))
    inventory = DiskInventory(excludes=(), entries={}, ctimes={}, deviations={})
    findings = scan_disk(guest, inventory, {"provider_key": (KEY,)})
    record_guest_scan(paths, "cell-1", 1, findings)
    kept = read_model(paths.guest_scan("cell-1", 1), GuestScan)
    assert [entry.file for entry in kept.searched_as_bytes] == ["guest:/root/odd.bin"]
