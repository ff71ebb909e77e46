"""The one reading of a run's archive: the subset of gzip and POSIX pax that ``runner archive``
writes (runner.archive.tarball.write_members: Python's tarfile in PAX_FORMAT inside
``gzip.GzipFile(filename="", mtime=0)``), parsed block by block as it is inflated, in bounded
memory. Anything else is refused in one line naming the byte offset (of the file for the gzip
layer, of the inflated tar stream for the tar layer), so that no other reader (GNU tar, Python's
tarfile) can find in an accepted archive a member the check did not read.

The subset:

- gzip: one member; its 10-byte header exactly ``1f 8b 08 00 00000000 02 ff`` (deflate, no
  FLG bits: no name, comment or extra field; MTIME 0; XFL 2, the best compression; OS 255); its
  CRC-32 and ISIZE those of the inflated bytes; nothing after it.
- tar: 512-byte ustar headers, magic ``ustar\\0`` version ``00``, checksum recomputed and
  written as tarfile writes it; typeflag ``0`` (a regular file: mode 0644, uid and gid 0, mtime
  0, no link name, empty user and group names, empty device numbers, empty prefix), each
  optionally preceded by one pax header ``x`` (named ``././@PaxHeader``, at most
  ``MAX_PAX_BYTES``) holding ``path`` (a name tarfile could not put in the header: over 100
  characters or not ASCII) and/or ``size`` (8 GiB or more), nothing else; every padding byte
  zero; after the last member two zero blocks, zeros to the end of the 10240-byte record, and
  the end of the stream.
- names: UTF-8, no control characters, relative, canonical (no ``.``, ``..`` or empty part).

Every read draws from a ``Budget`` for the whole archive before it happens: the bytes inflated,
the members, the member bytes read out (each member's whole size before its first byte). The
caller sets it from constants and, once it has verified the signed manifest, from that
(runner.archive.tarball.unpack); a cap passed is refused in one line like any other fault.
"""

from __future__ import annotations

import posixpath
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from runner.core.errors import InputError

BLOCK = 512
RECORD = 20 * BLOCK  # tarfile pads the stream to a whole record
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
_GZIP_FIELDS = ("ID1", "ID2", "CM", "FLG", "MTIME", "MTIME", "MTIME", "MTIME", "XFL", "OS")
MAX_PAX_BYTES = 8192  # a pax header's records: one path of at most MAX_NAME_BYTES and a size
MAX_NAME_BYTES = 4096
MAX_MEMBERS = 1 << 20
MAX_STREAM_BYTES = 65 << 30  # a whole archive's tar stream, inflated
MAX_UNPACKED_BYTES = 64 << 30  # a whole archive's members together
USTAR_NAME = 100  # characters tarfile keeps in the header before it writes a pax path
PAX_SIZE = 8**11  # the smallest size tarfile writes in a pax header
_CHUNK = 1 << 16
_ZERO_BLOCK = bytes(BLOCK)
_OCTAL_11 = re.compile(rb"[0-7]{11}\x00")
_RECORD = re.compile(rb"([1-9][0-9]*) ")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class ArchiveFormatError(InputError):
    """The archive is not in the subset ``runner archive`` writes."""


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    offset: int  # of its first header block (its pax header's, if any) in the tar stream


Spend = Literal["inflated", "members", "unpacked"]
_UNITS: dict[Spend, str] = {
    "inflated": "B inflated",
    "members": "members",
    "unpacked": "B of members",
}


@dataclass
class Budget:
    """What reading one archive may cost at most; each draw is checked before the read it pays
    for. ``grant`` replaces the caps, never what was spent: the reader of a signed archive
    grants what its verified manifest allows."""

    caps: dict[Spend, int]
    why: str  # what set the caps, for the refusal's line
    spent: dict[Spend, int] = field(default_factory=lambda: dict.fromkeys(_UNITS, 0))

    @classmethod
    def constant(cls) -> Budget:
        return cls(
            {"inflated": MAX_STREAM_BYTES, "members": MAX_MEMBERS, "unpacked": MAX_UNPACKED_BYTES},
            "the constant caps",
        )

    def grant(self, caps: dict[Spend, int], why: str) -> None:
        self.caps, self.why = caps, why

    def draw(self, what: Spend, amount: int) -> str | None:
        """Spend ``amount`` of ``what``; or, when that passes its cap, why not (nothing spent)."""
        if self.spent[what] + amount > self.caps[what]:
            return f"over the cap of {self.caps[what]} {_UNITS[what]} ({self.why})"
        self.spent[what] += amount
        return None


def stream_bound(sizes: list[int]) -> int:
    """The longest tar stream `runner archive` writes for members of ``sizes``: each a header,
    at most one pax header and its bytes padded; then the end blocks and the record's padding."""
    member = 2 * BLOCK + _padded(MAX_PAX_BYTES)
    return sum(member + _padded(size) for size in sizes) + 2 * BLOCK + RECORD


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a member's name (None: it can)."""
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"member name {name[:64]!r}... is over {MAX_NAME_BYTES} bytes"
    if _CONTROL.search(name) or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return f"member name {name!r} holds a control character"
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return f"member name {name!r} is not in canonical form"
    assert name == posixpath.normpath(name)
    return None


class _Inflated:
    """The tar stream inflated from the archive's one gzip member, read in exact amounts."""

    def __init__(self, handle: BinaryIO, archive: Path, budget: Budget) -> None:
        self._handle, self._archive, self._budget = handle, archive, budget
        header = handle.read(len(GZIP_HEADER))
        for at, (found, wanted) in enumerate(zip(header, GZIP_HEADER, strict=False)):
            if found != wanted:
                self._refuse(
                    at,
                    f"the gzip header's {_GZIP_FIELDS[at]} byte is 0x{found:02x}, "
                    f"`runner archive` writes 0x{wanted:02x}",
                )
        if len(header) < len(GZIP_HEADER):
            self._refuse(len(header), "the file ends inside the gzip header")
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        self._fed = len(GZIP_HEADER)  # bytes of the file handed to the inflater
        self._pending = bytearray()  # inflated, not yet read
        self._crc = 0
        self._inflated = 0
        self.offset = 0  # of the next byte read, in the tar stream

    def _refuse(self, at: int, problem: str) -> None:
        raise ArchiveFormatError(f"{self._archive}: at byte {at} of the file, {problem}")

    def _inflate(self) -> bool:
        """Inflate up to one chunk more into ``_pending``; False at the deflate stream's end."""
        if self._inflater.eof:
            return False
        data = self._inflater.unconsumed_tail
        if not data:
            data = self._handle.read(_CHUNK)
            if not data:
                self._refuse(self._fed, "the file ends inside the compressed stream")
            self._fed += len(data)
        # Never more than the budget's room and one byte: that byte, if the stream has it, is
        # the refusal (max_length 0 would be no limit at all).
        room = self._budget.caps["inflated"] - self._budget.spent["inflated"]
        try:
            out = self._inflater.decompress(data, min(_CHUNK, max(room, 0) + 1))
        except zlib.error as error:
            self._refuse(self._fed, f"the compressed stream is corrupt before it ({error})")
        over = self._budget.draw("inflated", len(out))
        if over is not None:
            raise ArchiveFormatError(
                f"{self._archive}: at byte {self._budget.caps['inflated']} of the tar stream, "
                f"the stream goes on, {over}"
            )
        self._crc = zlib.crc32(out, self._crc)
        self._inflated += len(out)
        self._pending += out
        return True

    def read(self, size: int) -> bytes:
        """``size`` bytes, fewer only at the end of the stream."""
        while len(self._pending) < size and self._inflate():
            pass
        data = bytes(self._pending[:size])
        del self._pending[:size]
        self.offset += len(data)
        return data

    def exact(self, size: int, what: str) -> bytes:
        start = self.offset
        data = self.read(size)
        if len(data) < size:
            raise ArchiveFormatError(
                f"{self._archive}: at byte {start} of the tar stream, the stream ends inside {what}"
            )
        return data

    def finish(self) -> None:
        """The deflate stream ended; its trailer matches, and nothing follows it."""
        while self._inflate():
            pass
        tail = bytes(self._inflater.unused_data)
        at = self._fed - len(tail)  # the trailer's offset in the file
        tail += self._handle.read(8 - len(tail)) if len(tail) < 8 else b""
        if len(tail) < 8:
            self._refuse(at, "the file ends inside the gzip trailer")
        if int.from_bytes(tail[:4], "little") != self._crc:
            self._refuse(at, "the gzip trailer's CRC-32 is not the inflated bytes'")
        if int.from_bytes(tail[4:8], "little") != self._inflated & 0xFFFFFFFF:
            self._refuse(at + 4, "the gzip trailer's ISIZE is not the inflated size")
        if len(tail) > 8 or self._handle.read(1):
            self._refuse(at + 8, "data follows the gzip member (a second member or junk)")


class _Tar:
    """The header checks, each refusing with the header's offset."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive

    def refuse(self, at: int, problem: str) -> ArchiveFormatError:
        return ArchiveFormatError(f"{self.archive}: at byte {at} of the tar stream, {problem}")

    def header(self, block: bytes, at: int, typeflag: bytes) -> int:
        """The size the header ``block`` gives, once every field is as tarfile writes it."""
        summed = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
        if block[148:156] != b"%06o\x00 " % summed:
            raise self.refuse(
                at, f"a header's checksum field {bytes(block[148:156])!r} is not its sum {summed:o}"
            )
        if block[156:157] != typeflag:
            raise self.refuse(
                at,
                f"typeflag {bytes(block[156:157])!r}: `runner archive` writes regular files "
                "('0'), each with at most one pax header ('x') before it",
            )
        mode = b"0000644\x00" if typeflag == b"0" else b"0000000\x00"
        fields = (
            (100, 108, "mode", mode),
            (108, 116, "uid", b"0000000\x00"),
            (116, 124, "gid", b"0000000\x00"),
            (136, 148, "mtime", b"00000000000\x00"),
            (157, 257, "linkname", bytes(100)),
            (257, 263, "magic", b"ustar\x00"),
            (263, 265, "version", b"00"),
            (265, 297, "uname", bytes(32)),
            (297, 329, "gname", bytes(32)),
            (329, 337, "devmajor", bytes(8)),
            (337, 345, "devminor", bytes(8)),
            (345, 500, "prefix", bytes(155)),
            (500, 512, "padding", bytes(12)),
        )
        for start, end, named, wanted in fields:
            if block[start:end] != wanted:
                raise self.refuse(
                    at + start,
                    f"the header's {named} field is {bytes(block[start:end])!r}, "
                    f"`runner archive` writes {wanted!r}",
                )
        if not _OCTAL_11.fullmatch(block[124:136]):
            size = bytes(block[124:136])
            raise self.refuse(at + 124, f"the header's size field {size!r} is not 11 octal digits")
        return int(block[124:135], 8)

    def pax(self, records: bytes, at: int) -> tuple[str | None, int | None]:
        """The path and size a pax header's records give: only those keys, in tarfile's order,
        each once, each written as tarfile writes it."""
        found: dict[str, str] = {}
        position = 0
        while position < len(records):
            length = _RECORD.match(records, position)
            if length is None or position + int(length[1]) > len(records):
                raise self.refuse(at + position, "a pax record is malformed")
            record = records[position : position + int(length[1])]
            keyword, equals, value = record[len(length[0]) :].partition(b"=")
            if not equals or not record.endswith(b"\n"):
                raise self.refuse(at + position, "a pax record is malformed")
            key = keyword.decode("ascii", "replace")
            if key not in ("path", "size") or key in found or (key == "path" and found):
                raise self.refuse(
                    at + position,
                    f"pax key {key!r}: `runner archive` writes only 'path' and 'size', once each",
                )
            try:
                found[key] = value[:-1].decode("utf-8")
            except UnicodeDecodeError:
                raise self.refuse(at + position, f"the pax {key} is not UTF-8") from None
            position += len(record)
        path, size = found.get("path"), found.get("size")
        if path is not None and path.isascii() and len(path) <= USTAR_NAME:
            raise self.refuse(at, f"a pax path {path!r} that fits the header's name field")
        if size is not None and (not re.fullmatch(r"[1-9][0-9]*", size) or int(size) < PAX_SIZE):
            raise self.refuse(at, f"a pax size {size[:32]!r} that is not a size over 8 GiB")
        return path, None if size is None else int(size)

    def name(self, block: bytes, at: int, pax_path: str | None) -> str:
        field = block[:100]
        if pax_path is not None:
            name = pax_path
            wanted = name.encode("ascii", "replace")[:100].ljust(100, b"\x00")
            if field != wanted:
                raise self.refuse(at, "the header's name field is not the pax path's first bytes")
        else:
            raw = field.rstrip(b"\x00")
            if b"\x00" in raw or not raw.isascii():
                raise self.refuse(at, f"the header's name field {raw!r} is not one ASCII name")
            name = raw.decode("ascii")
        problem = name_problem(name)
        if problem is not None:
            raise self.refuse(at, problem)
        return name


def read_members(
    archive: Path,
    take: Callable[[Member], BinaryIO | None] = lambda member: None,
    budget: Budget | None = None,
) -> list[Member]:
    """Every member of ``archive``, the whole file read and checked against the subset above
    within ``budget`` (the constant caps if None); ``take`` may refuse a member (raise) or
    return a handle its bytes are written to (closed after them)."""
    budget = Budget.constant() if budget is None else budget
    tar = _Tar(archive)
    members: list[Member] = []
    with archive.open("rb") as handle:
        stream = _Inflated(handle, archive, budget)
        while True:
            at = stream.offset
            block = stream.exact(BLOCK, "a header")
            if block == _ZERO_BLOCK:
                break
            path, pax_size = None, None
            if block[156:157] == b"x":
                if block[:100] != b"././@PaxHeader".ljust(100, b"\x00"):
                    raise tar.refuse(at, "a pax header not named '././@PaxHeader'")
                length = tar.header(block, at, b"x")
                if not 0 < length <= MAX_PAX_BYTES:
                    raise tar.refuse(
                        at + 124, f"a pax header of {length} B (at most {MAX_PAX_BYTES} B)"
                    )
                records = stream.exact(_padded(length), "a pax header")
                _zeros(tar, records[length:], stream.offset - len(records) + length, "padding")
                path, pax_size = tar.pax(records[:length], at + BLOCK)
                header_at = stream.offset
                block = stream.exact(BLOCK, "a header")
            else:
                header_at = at
            size = tar.header(block, header_at, b"0")
            if pax_size is not None:
                if size != 0:
                    raise tar.refuse(header_at + 124, "a size field beside a pax size")
                size = pax_size
            name = tar.name(block, header_at, path)
            draws: tuple[tuple[Spend, int], ...] = (("members", 1), ("unpacked", size))
            for what, amount in draws:
                over = budget.draw(what, amount)
                if over is not None:
                    raise tar.refuse(at, f"member {name!r} of {size} B is {over}")
            member = Member(name, size, at)
            members.append(member)
            sink = take(member)
            try:
                left = size
                while left:
                    chunk = stream.exact(min(left, _CHUNK), f"{name!r}")
                    left -= len(chunk)
                    if sink is not None:
                        sink.write(chunk)
            finally:
                if sink is not None:
                    sink.close()
            padding = stream.exact(_padded(size) - size, f"{name!r}'s padding")
            _zeros(tar, padding, stream.offset - len(padding), "padding")
        if not members:
            raise tar.refuse(0, "no members")
        end = ((at + 2 * BLOCK + RECORD - 1) // RECORD) * RECORD
        rest = stream.exact(end - at - BLOCK, "the end-of-archive blocks")
        _zeros(tar, rest, at + BLOCK, "the end-of-archive blocks and the record's zero padding")
        if stream.read(1):
            raise tar.refuse(end, "data follows the end of the archive")
        stream.finish()
    return members


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _zeros(tar: _Tar, data: bytes, at: int, what: str) -> None:
    nonzero = next((i for i, byte in enumerate(data) if byte), None)
    if nonzero is not None:
        raise tar.refuse(at + nonzero, f"a non-zero byte in {what}")
