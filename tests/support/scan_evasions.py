"""The scan evasions of #34: files that hold a bearer (found by its shape) and the provider's key
in the forms the guest's own tools write or open, each built as an agent would, with the tool
where there is one. tests/test_scan_forms.py scans each; bench/archive_attacks.py archives
each with `runner archive`."""

from __future__ import annotations

import base64
import gzip
import io
import json
import lzma
import random
import subprocess
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

from runner.proxy.bearer import new_bearer

KEY = "sk-real-provider-key-7f3a9c2e"
BEARER = new_bearer()  # known to no one: found by its shape
LINE = f"export OPENAI_API_KEY={KEY}\nAuthorization: Bearer {BEARER}\n".encode()


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


EVASIONS: dict[str, Callable[[Path], bytes]] = {
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
