"""What kind of container a layer's first bytes make it, by structure: runner.scan.layers
reads each kind.

A kind is known by what its own tools check, not by header fields they ignore: gzip by its
magic, method and reserved flags (any XFL, any OS: gunzip reads them all), bzip2 by its block
size and first block's magic, xz by its six-byte magic, tar by its header's checksum (v7, ustar
and GNU alike), cpio and ar by their magics, zip by a local header's fields. Three kinds say
little in their header, so a probe decodes them: zlib (two bytes, one file in some two
thousand begins like it), lzma-alone (a properties byte, a size and the range coder's first
byte) and raw deflate (nothing at all: any layer of no other kind is tried as one).
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from dataclasses import dataclass
from typing import Protocol

HEAD = 512  # a tar header's size: every kind below is told within it

ZIP_LOCAL = b"PK\x03\x04"
_AR = b"!<arch>\n"
_CPIO = (b"070701", b"070702", b"070707")
_BZIP2_BLOCKS = (bytes.fromhex("314159265359"), bytes.fromhex("177245385090"))
_XZ = b"\xfd7zXZ\x00"
# Containers no library here opens: each is a finding (what it holds cannot be searched).
_UNOPENABLE = {
    b"\x28\xb5\x2f\xfd": "zstd",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"Rar!\x1a\x07": "rar",
    b"\x04\x22\x4d\x18": "lz4",
    b"LZIP": "lzip",
}


class Decoder(Protocol):
    """What zlib's, lzma's and bz2's decompressors have in common (zlib's through _Zlib)."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    @property
    def needs_input(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...


@dataclass(frozen=True)
class Stream:
    """A compressed stream's kind: ``name`` names its layer, ``member`` is the magic of another
    stream that may follow it, ``proves``: its header alone tells it from chance bytes,
    ``trailing``: bytes other than zeros may follow its last stream."""

    name: str
    member: bytes = b""
    proves: bool = True
    trailing: bool = True


GZIP = Stream("gzip", member=b"\x1f\x8b\x08", trailing=False)  # gunzip warns of junk after
ZLIB = Stream("zlib", proves=False)
DEFLATE = Stream("deflate", proves=False)
XZ = Stream("xz", member=_XZ)
LZMA_ALONE = Stream("lzma", proves=False)
BZIP2 = Stream("bzip2", member=b"BZh")
# A zip member's streams: one each, what follows is the zip's; the zip's header tells them.
ZIP_DEFLATE = Stream("deflate", proves=False)
ZIP_BZIP2 = Stream("bzip2", proves=False)
ZIP_LZMA = Stream("lzma", proves=False)


class _Zlib:
    """zlib's decompressor with the interface of lzma's and bz2's: input it could not take for
    ``max_length`` is kept for the next call."""

    def __init__(self, wbits: int) -> None:
        self._inflater = zlib.decompressobj(wbits)
        self._tail = b""

    @property
    def eof(self) -> bool:
        return self._inflater.eof

    @property
    def unused_data(self) -> bytes:
        return self._inflater.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._tail

    def decompress(self, data: bytes, max_length: int, /) -> bytes:
        out = self._inflater.decompress(self._tail + data, max_length)
        self._tail = self._inflater.unconsumed_tail
        return out


def new_decoder(stream: Stream, properties: bytes = b"") -> Decoder:
    """A decoder of ``stream``; ``properties``: a zip LZMA member's (its header's last five
    bytes)."""
    if stream is GZIP:
        return _Zlib(16 + zlib.MAX_WBITS)
    if stream is ZLIB:
        return _Zlib(zlib.MAX_WBITS)
    if stream in (DEFLATE, ZIP_DEFLATE):
        return _Zlib(-zlib.MAX_WBITS)
    if stream is XZ:
        return lzma.LZMADecompressor(lzma.FORMAT_XZ)
    if stream is LZMA_ALONE:
        return lzma.LZMADecompressor(lzma.FORMAT_ALONE)
    if stream is ZIP_LZMA:
        return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[_lzma1(properties)])
    return bz2.BZ2Decompressor()


def _lzma1(properties: bytes) -> dict[str, int]:
    """LZMA1's filter from its five property bytes (lc, lp, pb in one; the dictionary size)."""
    packed = properties[0]
    return {
        "id": lzma.FILTER_LZMA1,
        "lc": packed % 9,
        "lp": packed // 9 % 5,
        "pb": packed // 45,
        "dict_size": int.from_bytes(properties[1:5], "little"),
    }


@dataclass(frozen=True)
class Seen:
    """What a layer's head says it is: ``kind`` (a stream's name, "zip", "tar", "cpio", "ar"),
    ``stream`` for a compressed stream, ``problem`` when it only began like ``kind`` (searched
    as bytes; ``fatal``: a container the scan cannot open, a finding)."""

    kind: str
    stream: Stream | None = None
    problem: str | None = None
    fatal: bool = False

    @property
    def proves(self) -> bool:
        return self.stream is None or self.stream.proves


def classify(head: bytes) -> Seen | None:
    """The kind ``head`` (a layer's first ``HEAD`` bytes) begins, or None (plain bytes; raw
    deflate is the caller's to try)."""
    for magic, name in _UNOPENABLE.items():
        if head.startswith(magic):
            return Seen(name, problem=f"a {name} container, which the scan cannot open", fatal=True)
    return (
        _gzip(head)
        or _bzip2(head)
        or (Seen("xz", XZ) if head.startswith(_XZ) else None)
        or _compress(head)
        or (Seen("zip") if head.startswith(ZIP_LOCAL) else None)
        or (Seen("ar") if head.startswith(_AR) else None)
        or (Seen("cpio") if head[:6] in _CPIO else None)
        or (Seen("tar") if tar_header(head) else None)
        or _zlib(head)
        or _lzma_alone(head)
    )


# The first byte of each kind a header proves: the kinds a text's decoded bytes may be (tar's
# first byte is a name's: its checksum tells).
_PROVEN_FIRST = frozenset(b"\x1fB\xfdP!0")


def may_be_proven(data: bytes) -> bool:
    """Whether ``data`` may begin a kind its header proves (an empty gzip takes 20 bytes)."""
    return len(data) >= 20 and (data[0] in _PROVEN_FIRST or len(data) >= 512)


def proven_kind(head: bytes) -> Seen | None:
    """The kind ``head`` begins if its header proves it, else None: what a stretch of text
    decoded (base64 of a gzip) is opened as, where chance bytes abound."""
    if not may_be_proven(head) or (head[0] not in _PROVEN_FIRST and not tar_header(head)):
        return None
    seen = classify(head)
    return seen if seen is not None and seen.proves and seen.problem is None else None


def _gzip(head: bytes) -> Seen | None:
    if not head.startswith(b"\x1f\x8b"):
        return None
    if head[2:3] != b"\x08":
        return Seen("gzip", problem=f"gzip's method {head[2:3].hex() or 'missing'} is not deflate")
    if len(head) < 10 or head[3] & 0xE0:
        return Seen("gzip", problem="a gzip header with reserved flags set (gunzip refuses it)")
    return Seen("gzip", GZIP)


def _bzip2(head: bytes) -> Seen | None:
    if not head.startswith(b"BZh"):
        return None
    if head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in _BZIP2_BLOCKS:
        return Seen("bzip2", BZIP2)
    return Seen("bzip2", problem="a bzip2 magic without a block size and block after it")


def _compress(head: bytes) -> Seen | None:
    if head.startswith(b"\x1f\x9d"):  # two bytes: one binary in 65,536 begins so, no finding
        return Seen("compress", problem="compress's .Z (LZW), which the scan cannot open")
    return None


def tar_header(block: bytes) -> bool:
    """Whether ``block`` is a tar header: its checksum field holds the sum of its bytes (the
    field itself as spaces), unsigned or signed as tar writers have it."""
    field = block[148:156]
    if len(block) < 512 or not field.strip(b" \x00") or field.translate(None, b"01234567 \x00"):
        return False
    try:
        recorded = int(block[148:156].replace(b"\x00", b" ").strip() or b"x", 8)
    except ValueError:
        return False
    unsigned = sum(block[:148]) + sum(block[156:512]) + 8 * 0x20
    if recorded == unsigned:
        return True
    high = sum(1 for byte in block[:148] + block[156:512] if byte >= 0x80)
    return recorded == unsigned - 256 * high


def _zlib(head: bytes) -> Seen | None:
    """zlib's header: deflate, a window of at most 32 KiB, no preset dictionary (git uses
    none), the check bits right."""
    if len(head) < 2 or head[0] & 0x0F != 8 or head[0] >> 4 > 7 or head[1] & 0x20:
        return None
    return Seen("zlib", ZLIB) if (head[0] << 8 | head[1]) % 31 == 0 else None


def _lzma_alone(head: bytes) -> Seen | None:
    """lzma-alone's header as xz checks it when it tells a .lzma file by its content:
    properties lc, lp, pb in range, a dictionary size of 2^n or 2^n + 2^(n-1) bytes, the size
    unknown (all ones) or under 256 GiB, then the range coder's first byte, always 0."""
    if len(head) < 14 or head[0] >= 9 * 5 * 5 or head[13] != 0:
        return None
    dictionary = int.from_bytes(head[1:5], "little")
    low = dictionary & -dictionary  # its lowest bit set
    if dictionary < 4096 or (dictionary not in (low, low * 3) and dictionary != 0xFFFFFFFF):
        return None
    size = int.from_bytes(head[5:13], "little")
    return Seen("lzma", LZMA_ALONE) if size == (1 << 64) - 1 or size < 1 << 38 else None


# A zip member's compression method -> its stream (None: stored); the LZMA header's length.
_ZIP_METHODS: dict[int, Stream | None] = {0: None, 8: ZIP_DEFLATE, 12: ZIP_BZIP2, 14: ZIP_LZMA}
# Methods zip tools write that the scan cannot read (deflate64, zstd, xz, AES, ...).
_ZIP_UNREADABLE = frozenset({1, 2, 3, 4, 5, 6, 9, 10, 18, 19, 93, 94, 95, 96, 97, 98, 99})
_ZIP64 = 0xFFFFFFFF


@dataclass(frozen=True)
class ZipMember:
    """A zip local header's fields the scan reads; ``problem`` when it is none the scan can
    read (``fatal``: a real member of a method or encryption it cannot open)."""

    stream: Stream | None = None
    flags: int = 0
    size: int = 0
    name_size: int = 0
    extra_size: int = 0
    problem: str | None = None
    fatal: bool = False

    @property
    def prefix(self) -> int:
        """Bytes of the method's own header before its stream (LZMA's: version, properties)."""
        return 9 if self.stream is ZIP_LZMA else 0

    def compressed_size(self, extra: bytes) -> int | None:
        """The member's stored bytes (from zip64's extra field when the header has no room),
        or None when only the data descriptor after it has it."""
        if self.flags & 0x08 and self.size == 0:
            return None
        if self.size != _ZIP64:
            return self.size
        at = 0
        while at + 4 <= len(extra):
            tag, length = int.from_bytes(extra[at : at + 2], "little"), extra[at + 2]
            length |= extra[at + 3] << 8
            if tag == 1 and length >= 16:
                return int.from_bytes(extra[at + 12 : at + 20], "little")
            at += 4 + length
        return None


def zip_member_kind(header: bytes) -> ZipMember:
    """What the 30-byte local header ``header`` says of its member."""
    if len(header) < 30 or not header.startswith(ZIP_LOCAL):
        return ZipMember(problem="a torn zip local header")
    version, flags, method = (int.from_bytes(header[at : at + 2], "little") for at in (4, 6, 8))
    name_size = int.from_bytes(header[26:28], "little")
    if version > 63 or not 0 < name_size <= 4096:  # not a header: bytes that hold its magic
        return ZipMember(problem="a zip local header of no zip tool")
    if method not in _ZIP_METHODS:
        problem = f"a zip member of method {method}, which the scan cannot open"
        return ZipMember(problem=problem, fatal=method in _ZIP_UNREADABLE)
    if flags & 0x01:
        return ZipMember(problem="an encrypted zip member", fatal=True)
    return ZipMember(
        stream=_ZIP_METHODS[method],
        flags=flags,
        size=int.from_bytes(header[18:22], "little"),
        name_size=name_size,
        extra_size=int.from_bytes(header[28:30], "little"),
    )
