"""The credential scan opens what the guest's own tools open and decodes what they decode: each
evasion of #34 ("Scan evasion") built as an agent would, with the tools where there is one, and
found; a file that only begins like a container searched as bytes, with why, never a failure."""

from __future__ import annotations

import base64
import gzip
import io
import json
import lzma
import random
import subprocess
import tarfile
import urllib.parse
import zlib
from pathlib import Path

import pytest

from runner.core.files import read_model
from runner.freeze.inventory import DiskInventory
from runner.proxy.bearer import new_bearer
from runner.records.paths import RunPaths
from runner.run import containers
from runner.run.containers import InflateBudget
from runner.run.guest_scan import GuestScan, record_guest_scan, scan_disk
from runner.run.scan import ScanReport, scan, scan_run

KEY = "sk-real-provider-key-7f3a9c2e"
BEARER = new_bearer()  # known to no one: found by its shape
LINE = f"export OPENAI_API_KEY={KEY}\nAuthorization: Bearer {BEARER}\n".encode()
SECRETS = {"provider_key": [KEY]}


def run_tool(args: list[str], cwd: Path, stdin: bytes = b"") -> bytes:
    return subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, check=True).stdout


def gzip_with(offset: int, value: int) -> bytes:
    """A gzip of LINE whose header byte at ``offset`` is ``value`` (gunzip reads it)."""
    packed = bytearray(gzip.compress(LINE))
    packed[offset] = value
    assert gzip.decompress(bytes(packed)) == LINE
    return bytes(packed)


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def git_object(tmp_path: Path) -> bytes:
    """A loose object as git writes it (zlib), of a file holding LINE."""
    repo = tmp_path / "repo"
    repo.mkdir()
    run_tool(["git", "init", "-q"], repo)
    (repo / "env.sh").write_bytes(LINE)
    digest = run_tool(["git", "hash-object", "-w", "env.sh"], repo).decode().strip()
    return (repo / ".git" / "objects" / digest[:2] / digest[2:]).read_bytes()


def deb(tmp_path: Path) -> bytes:
    """A .deb as dpkg-deb lays it out, packed by ar: its data.tar.xz holds LINE."""
    work = tmp_path / "deb"
    (work / "root" / "etc").mkdir(parents=True)
    (work / "root" / "etc" / "agent.env").write_bytes(LINE)
    (work / "debian-binary").write_text("2.0\n")
    with tarfile.open(work / "control.tar.xz", "w:xz") as tar:
        info = tarfile.TarInfo("./control")
        control = b"Package: leak\nVersion: 1\n"
        info.size = len(control)
        tar.addfile(info, io.BytesIO(control))
    with tarfile.open(work / "data.tar.xz", "w:xz") as tar:
        tar.add(work / "root" / "etc", arcname="./etc")
    run_tool(["ar", "rc", "leak.deb", "debian-binary", "control.tar.xz", "data.tar.xz"], work)
    return (work / "leak.deb").read_bytes()


def cpio(tmp_path: Path, format_: str) -> bytes:
    work = tmp_path / f"cpio-{format_}"
    work.mkdir()
    (work / "agent.env.gz").write_bytes(gzip.compress(LINE))
    (work / "notes.txt").write_text("nothing here\n")
    return run_tool(["cpio", "-o", "-H", format_, "--quiet"], work, b"notes.txt\nagent.env.gz\n")


def zip_after_prefix(tmp_path: Path) -> bytes:
    """A self-extracting zip: a stub, then a zip made by zip (unzip reads it, with a warning)."""
    work = tmp_path / "sfx"
    work.mkdir()
    (work / "agent.env").write_bytes(LINE * 20)
    run_tool(["zip", "-q", "inner.zip", "agent.env"], work)
    stub = b"\x7fELF\x02\x01\x01" + random.Random(7).randbytes(5000)
    return stub + (work / "inner.zip").read_bytes()


def dump(tool: list[str], data: bytes, tmp_path: Path) -> bytes:
    return run_tool(tool, tmp_path, data)


def percent(text: str) -> bytes:
    """Every byte as %XX, as a URL encoder that escapes everything writes it."""
    return "".join(f"%{byte:02X}" for byte in text.encode()).encode()


def u_escapes(text: str) -> bytes:
    return "".join(f"\\u{ord(char):04x}" for char in text).encode()


EVASIONS = {
    "gzip, OS byte 0x42": lambda tmp: gzip_with(9, 0x42),
    "gzip, XFL byte 0x07": lambda tmp: gzip_with(8, 0x07),
    "git loose object (zlib)": git_object,
    "raw deflate": lambda tmp: raw_deflate(LINE),
    "lzma-alone": lambda tmp: lzma.compress(LINE, format=lzma.FORMAT_ALONE),
    ".deb made with ar": deb,
    "cpio newc": lambda tmp: cpio(tmp, "newc"),
    "cpio odc": lambda tmp: cpio(tmp, "odc"),
    "zip after a prefix": zip_after_prefix,
    "base64 wrapped at 76 columns": lambda tmp: base64.encodebytes(LINE),  # the bearer on two
    "base64 of base64": lambda tmp: base64.b64encode(base64.b64encode(LINE)),
    "base64 of gzip": lambda tmp: b'{"blob": "' + base64.b64encode(gzip.compress(LINE)) + b'"}',
    "hex": lambda tmp: LINE.hex().encode(),
    "xxd dump": lambda tmp: dump(["xxd"], LINE, tmp),
    "hexdump -C": lambda tmp: dump(["hexdump", "-C"], LINE, tmp),
    "bearer split by a newline after fbr_": lambda tmp: (BEARER[:4] + "\n" + BEARER[4:]).encode(),
    "bearer split by JSON's \\n": lambda tmp: json.dumps(BEARER[:4] + "\n" + BEARER[4:]).encode(),
    "bearer split by a colour code": lambda tmp: (BEARER[:4] + "\x1b[0m" + BEARER[4:]).encode(),
    "%XX of the bearer": lambda tmp: percent(BEARER),
    "\\u escapes of the bearer": lambda tmp: u_escapes(BEARER),
    "\\x escapes of the bearer": lambda tmp: "".join(
        f"\\x{b:02x}" for b in BEARER.encode()
    ).encode(),
}


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
    monkeypatch.setattr(containers, "MAX_INFLATED_BYTES", 8 << 20)
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
