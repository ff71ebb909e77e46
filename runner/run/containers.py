"""What a scanned file holds inside: its compressed and archived layers, each read as a stream.

The credential scan (runner.run.scan) searches a file's bytes and, when they are compressed
(gzip, bzip2, xz) or archived (zip, tar), every layer inside, to ``MAX_DEPTH`` containers deep
(a ``.tar.gz`` is two). Each layer is streamed in pieces of at most ``CHUNK`` bytes, never
inflated whole into memory (a zip, which is read from its end, is spooled to a temporary file);
all layers of one file together may inflate to ``MAX_INFLATED_BYTES``, or all files of a scan
together to one budget the caller shares (``InflateBudget``). Whatever stops a layer
from being read to its end is ``Unreadable``, a finding of the scan, never a silent skip: a
truncated or corrupt stream, a container nested deeper than ``MAX_DEPTH``, a container of a
kind the scan cannot open (zstd, 7z, ...), the cap passed (a decompression bomb). What a layer
was not read through may hold a secret.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from typing import IO, Protocol, cast

CHUNK = 1 << 20
HEAD = 512  # a tar header's size: the magic of every kind below lies within it
MAX_DEPTH = 4  # containers inside one another, the file's own compression the first
MAX_INFLATED_BYTES = 4 << 30  # all inner layers of one file together

# Magic at a layer's start -> the stream of what it compresses (closed by its caller; the
# layer is a file object in all but typeshed's name for it).
_STREAMS: dict[bytes, Callable[[_Layer], io.BufferedIOBase]] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": lambda raw: bz2.BZ2File(raw),
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(cast(IO[bytes], raw)),  # noqa: SIM115
}
# A guest disk holds hundreds of thousands of binary files: one whose first bytes happen to be a
# short magic must not be taken for a (then corrupt) container, so the short ones are checked
# further: gzip's method deflate, its flags' reserved bits clear, its XFL one of deflate's, its
# OS a known one; bzip2's block size a digit and its first block's (or end-of-stream) magic.
_BZIP2_BLOCKS = (bytes.fromhex("314159265359"), bytes.fromhex("177245385090"))


def _plausible(magic: bytes, head: bytes) -> bool:
    if magic.startswith(b"\x1f\x8b"):
        return (
            len(head) >= 10
            and head[3] & 0xE0 == 0
            and head[8] in (0, 2, 4)
            and (head[9] <= 13 or head[9] == 255)
        )
    if magic == b"BZh":
        return head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in _BZIP2_BLOCKS
    return True


_ZIP = b"PK\x03\x04"
_TAR = (257, b"ustar")  # offset and magic of a POSIX or GNU tar header
# Containers the stdlib cannot open: each is a finding (what it holds cannot be searched).
_UNOPENABLE = {
    b"\x28\xb5\x2f\xfd": "zstd",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"Rar!\x1a\x07": "rar",
    b"\x04\x22\x4d\x18": "lz4",
    b"LZIP": "lzip",
}  # not compress's .Z: its magic is 2 bytes, one binary file in 65,536 starts so


class Unreadable(Exception):
    """A layer the scan could not read to its end, and why."""


# What a stream's own reader, or a corrupt or truncated stream, raises.
READ_ERRORS = (
    Unreadable,
    OSError,
    EOFError,
    zipfile.BadZipFile,
    lzma.LZMAError,
    tarfile.TarError,
    zlib.error,
)

Feed = Callable[[bytes], None]
# Called once per layer with the layer's place (the names of the containers it is in, outermost
# first; () for the file itself); every byte of that layer goes to the feed it returns.
Visit = Callable[[tuple[str, ...]], Feed]


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class InflateBudget:
    """The bytes a scan may inflate: one file's (``MAX_INFLATED_BYTES``) unless the caller
    shares one budget among files (the archive check: one for the whole archive)."""

    def __init__(self, cap: int | None = None, of: str = "one file") -> None:
        self.cap = MAX_INFLATED_BYTES if cap is None else cap
        self.of = of
        self.left = self.cap

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise Unreadable(f"more than {self.cap} bytes inflated (the cap for {self.of})")


class _Layer(io.RawIOBase):
    """One layer's stream: each byte read through it is fed to the layer's search once. Its
    head is read first, to tell what the layer is, and handed back to the first reads."""

    def __init__(self, stream: _Readable, feed: Feed, budget: InflateBudget | None) -> None:
        super().__init__()
        self.stream, self.feed, self.budget = stream, feed, budget
        self.size = 0
        self.pending = b""
        self.head = self.read(HEAD)
        self.pending = self.head

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = CHUNK) -> bytes:
        size = CHUNK if size is None or size < 0 else min(size, CHUNK)  # never a whole stream
        if self.pending:
            data, self.pending = self.pending[:size], self.pending[size:]
            return data
        data = self.stream.read(size)
        self.size += len(data)
        if self.budget is not None:
            self.budget.spend(len(data))
        self.feed(data)
        return data


def read_layers(stream: _Readable, visit: Visit, budget: InflateBudget | None = None) -> int:
    """Read ``stream`` and every layer inside it to its end, each fed to ``visit``'s feed,
    inflating within ``budget`` (the file's own when None); the bytes of ``stream`` itself.
    Raises one of ``READ_ERRORS`` when a layer cannot be read to its end, naming the layer."""
    budget = InflateBudget() if budget is None else budget
    return _read(stream, (), visit, budget, inflated=False).size


def _read(
    stream: _Readable, inside: tuple[str, ...], visit: Visit, budget: InflateBudget, inflated: bool
) -> _Layer:
    """``inflated``: the layer's bytes are decompressed here (a tar member's are not: they are
    its tar's bytes again), so they are spent from ``budget``."""
    try:
        layer = _Layer(stream, visit(inside), budget if inflated else None)
        _open(layer, inside, visit, budget)
        while layer.read(CHUNK):  # past what a container's reader read: trailing bytes
            pass
    except Unreadable:
        raise
    except READ_ERRORS as error:
        raise Unreadable(f"{_where(inside)}: {error}") from error
    return layer


def _where(inside: tuple[str, ...]) -> str:
    return "!".join(inside) or "the file"


def _open(layer: _Layer, inside: tuple[str, ...], visit: Visit, budget: InflateBudget) -> None:
    """Read the layers inside ``layer``, if it is a container."""
    head = layer.head
    magic = next(
        (magic for magic in _STREAMS if head.startswith(magic) and _plausible(magic, head)), None
    )
    is_zip = head.startswith(_ZIP)
    is_tar = head[_TAR[0] : _TAR[0] + len(_TAR[1])] == _TAR[1]
    unopenable = next((name for magic, name in _UNOPENABLE.items() if head.startswith(magic)), None)
    if unopenable is not None:
        raise Unreadable(f"{_where(inside)}: a {unopenable} container, which the scan cannot open")
    if magic is None and not is_zip and not is_tar:
        return
    if len(inside) >= MAX_DEPTH:
        raise Unreadable(f"{_where(inside)}: a container nested deeper than {MAX_DEPTH} levels")
    if magic is not None:
        with _STREAMS[magic](layer) as inner:
            _read(inner, (*inside, magic.hex()), visit, budget, inflated=True)
    elif is_zip:
        _zip_members(layer, inside, visit, budget)
    else:
        with tarfile.open(fileobj=layer, mode="r|") as tar:
            for member in tar:
                stream = tar.extractfile(member) if member.isfile() else None
                if stream is not None:  # a link, a directory, a device: no bytes of its own
                    _read(stream, (*inside, member.name), visit, budget, inflated=False)


def _zip_members(
    layer: _Layer, inside: tuple[str, ...], visit: Visit, budget: InflateBudget
) -> None:
    # A zip is read from its central directory at the end: spooled to disk, not to memory.
    with tempfile.TemporaryFile() as spool:
        while data := layer.read(CHUNK):
            spool.write(data)
        with zipfile.ZipFile(spool) as archive:
            for member in archive.infolist():
                if member.is_dir():
                    continue
                try:
                    stream = archive.open(member)
                except (RuntimeError, NotImplementedError) as error:  # encrypted, odd method
                    raise Unreadable(f"{_where((*inside, member.filename))}: {error}") from error
                with stream:
                    _read(stream, (*inside, member.filename), visit, budget, inflated=True)
