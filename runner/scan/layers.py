"""What a scanned file holds inside: its compressed and archived layers, each read as a stream.

The credential scan (runner.scan.scan) searches a file's bytes and every layer inside that the
guest's own tools could open, to ``MAX_DEPTH`` containers deep (a ``.tar.gz`` is two, a
``.deb``'s data three): gzip (any header's optional fields: gunzip reads them all), zlib (as
git stores an object), raw deflate, xz, lzma-alone (``.lzma``), bzip2, zip (also after a prefix:
a self-extracting or appended zip), tar, cpio (newc, crc, odc) and ar (a ``.deb``). A layer is
known by its structure, not a magic alone (runner.scan.layer_kinds), and streamed in pieces
of at most ``CHUNK`` bytes, never inflated whole into memory. All the files of one scan together
may inflate ``MAX_INFLATED_BYTES`` (``InflateBudget``).

Whatever stops a layer from being read to its end is ``Unreadable``, a finding of the scan,
never a silent skip: a truncated or corrupt stream, a container nested deeper than
``MAX_DEPTH``, a container of a kind the scan cannot open (zstd, 7z, ...), the budget spent (a
decompression bomb). What a layer was not read through may hold a secret.

A layer that only began like a container (a binary whose first bytes happen to be a magic: a
guest disk holds hundreds of thousands) is none: its stream breaks within its first ``PROBE``
bytes, or its first header is no header. It is searched as bytes, as a file of no container
kind is, and the visitor is told why (``Visitor.as_bytes``). So is a stream of a kind whose
header proves little (zlib's two bytes, lzma-alone's, raw deflate's none, a zip's local header
inside other bytes) wherever it breaks: what it decoded before was searched all the same.
"""

from __future__ import annotations

import lzma
import tarfile
import zlib
from collections.abc import Callable
from typing import Protocol

from runner.scan.layer_kinds import (
    DEFLATE,
    HEAD,
    ZIP_LOCAL,
    Seen,
    Stream,
    ZipMember,
    classify,
    new_decoder,
    zip_member_kind,
)

CHUNK = 1 << 20
PROBE = 64 << 10  # a stream broken within its first PROBE bytes was only a magic by chance
MAX_DEPTH = 4  # containers inside one another, the file's own compression the first
MAX_INFLATED_BYTES = 4 << 30  # all inner layers of all files of one scan together


class Unreadable(Exception):
    """A layer the scan could not read to its end, and why."""


class _NotThisKind(Unreadable):
    """The layer at ``inside`` began like a container of a kind but is none (``silent``: a
    probe for raw deflate, which any layer may be tried as, found none)."""

    def __init__(self, inside: tuple[str, ...], reason: str, silent: bool = False) -> None:
        super().__init__(reason)
        self.inside, self.reason, self.silent = inside, reason, silent


# What a stream's own reader, or a corrupt or truncated stream, raises.
READ_ERRORS = (Unreadable, OSError, EOFError, lzma.LZMAError, tarfile.TarError, zlib.error)

Feed = Callable[[bytes], None]


class LayerSearch(Protocol):
    def feed(self, data: bytes) -> None:
        """The layer's next bytes."""

    def end(self) -> None:
        """The layer was read to its end."""


class Visitor(Protocol):
    """Told of every layer of a file. A layer's place: the names of the containers it is in,
    outermost first (() for the file itself)."""

    def layer(self, inside: tuple[str, ...]) -> LayerSearch:
        """Called once per layer; every byte of that layer goes to the search it returns."""

    def as_bytes(self, inside: tuple[str, ...], reason: str) -> None:
        """The layer was searched as bytes only, though it began like a container: why."""


class InflateBudget:
    """The bytes a scan may inflate, all its files together (the archive check's: its whole
    archive)."""

    def __init__(self, cap: int | None = None, of: str = "one scan") -> None:
        self.cap = MAX_INFLATED_BYTES if cap is None else cap
        self.of = of
        self.left = self.cap

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise Unreadable(f"more than {self.cap} bytes inflated (the cap for {self.of})")


class _Source(Protocol):
    def read(self, size: int = CHUNK, /) -> bytes: ...

    def unread(self, data: bytes) -> None: ...

    def peek(self, size: int) -> bytes: ...


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class _Layer:
    """One layer's stream: each byte read through it is fed to the layer's search once (bytes
    handed back with ``unread`` or looked at with ``peek`` are not fed again)."""

    def __init__(self, stream: _Readable, feed: Feed, budget: InflateBudget | None) -> None:
        self.stream, self.feed, self.budget = stream, feed, budget
        self.size = 0
        self.pending = b""
        self.head = self.peek(HEAD)

    def readable(self) -> bool:  # tarfile's stream reader asks
        return True

    def read(self, size: int = CHUNK, /) -> bytes:
        size = CHUNK if size < 0 else min(size, CHUNK)  # never a whole stream
        if size == 0:
            return b""
        if self.pending:
            data, self.pending = self.pending[:size], self.pending[size:]
            return data
        return self._pull(size)

    def _pull(self, size: int) -> bytes:
        data = self.stream.read(size)
        self.size += len(data)
        if self.budget is not None:
            self.budget.spend(len(data))
        self.feed(data)
        return data

    def unread(self, data: bytes) -> None:
        self.pending = data + self.pending

    def peek(self, size: int) -> bytes:
        while len(self.pending) < size and (data := self._pull(size - len(self.pending))):
            self.pending += data
        return self.pending[:size]


class _Limited:
    """The next ``size`` bytes of ``source``: one member of an archive. Torn, it is
    ``Unreadable``; or, in a container of a kind whose header proves little (``owner``: that
    container's place), that container was none."""

    def __init__(
        self, source: _Source, size: int, what: str, owner: tuple[str, ...] | None = None
    ) -> None:
        self.source, self.left, self.what, self.owner = source, size, what, owner

    def read(self, size: int = CHUNK, /) -> bytes:
        if self.left <= 0:
            return b""
        data = self.source.read(min(size, self.left))
        if not data:
            why = f"{self.what}: {self.left} of its bytes missing (torn)"
            raise Unreadable(why) if self.owner is None else _NotThisKind(self.owner, why)
        self.left -= len(data)
        return data

    def unread(self, data: bytes) -> None:
        self.source.unread(data)
        self.left += len(data)

    def peek(self, size: int) -> bytes:
        return self.source.peek(min(size, self.left))

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def read_exact(source: _Source, size: int, what: str) -> bytes:
    data = b""
    while len(data) < size and (piece := source.read(size - len(data))):
        data += piece
    if len(data) < size:
        raise Unreadable(f"{what}: torn ({len(data)} of {size} bytes)")
    return data


class _Decoded:
    """What a compressed stream in ``source`` holds, decoded piece by piece; members of a kind
    that may follow one another (gzip, bzip2, xz) one after another.

    Its data breaking, or its source ending before its end, raises ``Unreadable`` if ``proves``
    (the stream is surely one), else ``_NotThisKind`` for ``owner``, the layer that proved to be
    none. ``probing``: the layer is being told by this stream, which proves it none when it
    breaks within its first ``PROBE`` bytes; what it read until then is handed back, to be read
    as bytes."""

    def __init__(
        self,
        source: _Source,
        kind: Stream,
        owner: tuple[str, ...],
        probing: bool = True,
        proves: bool | None = None,
        properties: bytes = b"",
        what: tuple[str, ...] | None = None,
    ) -> None:
        self.source, self.kind, self.owner = source, kind, owner
        self.what = _where(owner if what is None else what)
        self.member = what is not None  # a member's stream, its container the owner
        self.probing = probing
        self.proves = kind.proves if proves is None else proves
        self.properties = properties
        self.decoder = new_decoder(kind, properties)
        self.consumed = 0
        self.probed: list[bytes] = []

    def read(self, size: int = CHUNK, /) -> bytes:
        size = size if size > 0 else CHUNK
        while True:
            if self.decoder.eof and not self._next_member():
                return b""
            data = b""
            if self.decoder.needs_input:
                data = self.source.read(CHUNK if self.consumed >= PROBE else PROBE)
                if self.probing and self.consumed < PROBE and data:
                    self.probed.append(data)
                self.consumed += len(data)
            out = self._decode(data, size)
            if out:
                return out
            if not data and self.decoder.needs_input and not self.decoder.eof:
                raise self._broken("it ends before its stream does (truncated)", False)

    def _decode(self, data: bytes, size: int) -> bytes:
        try:
            return self.decoder.decompress(data, size)
        except (zlib.error, lzma.LZMAError, OSError, EOFError) as error:
            raise self._broken(f"its data is corrupt ({error})", True) from None

    def _next_member(self) -> bool:
        self.source.unread(self.decoder.unused_data)
        self.probing, self.probed = False, []  # a whole stream decoded: the layer is one
        member = self.kind.member
        if member and self.source.peek(len(member)).startswith(member):
            self.decoder = new_decoder(self.kind, self.properties)
            return True
        if not self.kind.trailing and self.proves and self.source.peek(CHUNK).strip(b"\x00"):
            raise Unreadable(f"{self.what}: bytes after its {self.kind.name} stream (junk)")
        return False

    def _broken(self, why: str, corrupt: bool) -> Unreadable:
        """``corrupt``: its data is none of the kind (truncated, a stream whose header proves
        it is one, torn)."""
        if self.member:
            reason = f"a member's {self.kind.name} data: {why}"
        else:
            reason = f"began like {self.kind.name}, but {why}"
        last = len(self.probed[-1]) if self.probed else 0
        early = self.probing and self.consumed - last < PROBE
        if early and (corrupt or not self.kind.proves):
            self.source.unread(b"".join(self.probed))
            return _NotThisKind(self.owner, reason, silent=self.kind is DEFLATE)
        if self.proves:
            return Unreadable(f"{self.what}: a {self.kind.name} stream, but {why}")
        return _NotThisKind(self.owner, reason)


def read_layers(stream: _Readable, visitor: Visitor, budget: InflateBudget) -> int:
    """Read ``stream`` and every layer inside it to its end, each fed to ``visitor``'s feed,
    inflating within ``budget``; the bytes of ``stream`` itself. Raises one of ``READ_ERRORS``
    when a layer cannot be read to its end, naming the layer."""
    return _read(stream, (), visitor, budget, inflated=False, weak=True).size


def _read(
    stream: _Readable,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
    inflated: bool,
    weak: bool,
) -> _Layer:
    """``inflated``: the layer's bytes are decompressed here (a tar member's are not: they are
    its tar's bytes again), so they are spent from ``budget``; ``weak``: the layer may be tried
    as a kind whose header proves little (not inside a raw deflate probe's output)."""
    try:
        search = visitor.layer(inside)
        layer = _Layer(stream, search.feed, budget if inflated else None)
        zip_from_start = _open(layer, inside, visitor, budget, weak)
        _rest(layer, inside, visitor, budget, zip_from_start, weak)
        search.end()
    except Unreadable:
        raise
    except READ_ERRORS as error:
        raise Unreadable(f"{_where(inside)}: {error}") from error
    return layer


def _where(inside: tuple[str, ...]) -> str:
    return "!".join(inside) or "the file"


def _open(
    layer: _Layer, inside: tuple[str, ...], visitor: Visitor, budget: InflateBudget, weak: bool
) -> bool:
    """Read the layers inside ``layer``, if it is a container; whether it is a zip, whose
    members ``_rest`` reads."""
    seen = classify(layer.head)
    if seen is None and weak and len(inside) < MAX_DEPTH:
        seen = Seen(DEFLATE.name, stream=DEFLATE)  # raw deflate has no header: a probe tells
    if seen is None or (not weak and not seen.proves):
        return False
    if seen.problem is not None:
        if seen.fatal:
            raise Unreadable(f"{_where(inside)}: {seen.problem}")
        visitor.as_bytes(inside, seen.problem)
        return False
    if len(inside) >= MAX_DEPTH:
        too_deep = f"a {seen.kind} nested deeper than {MAX_DEPTH} containers"
        if seen.proves:
            raise Unreadable(f"{_where(inside)}: {too_deep}")
        visitor.as_bytes(inside, too_deep)
        return False
    if seen.kind == "zip":
        return True
    try:
        _contents(layer, seen, inside, visitor, budget, weak)
    except _NotThisKind as error:
        if error.inside != inside:
            raise
        if not error.silent:
            visitor.as_bytes(inside, error.reason)
    return False


def _contents(
    layer: _Layer,
    seen: Seen,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
    weak: bool,
) -> None:
    if seen.stream is not None:
        decoded = _Decoded(layer, seen.stream, inside)
        inner_weak = weak and seen.stream is not DEFLATE
        _read(decoded, (*inside, seen.kind), visitor, budget, inflated=True, weak=inner_weak)
    elif seen.kind == "tar":
        _tar(layer, inside, visitor, budget)
    elif seen.kind == "cpio":
        _cpio(layer, inside, visitor, budget)
    else:
        _ar(layer, inside, visitor, budget)


def _member(
    source: _Source,
    size: int,
    name: str,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
) -> None:
    """One member of an archive, stored as it is: a layer of its own."""
    member = _Limited(source, size, _where((*inside, name)))
    _read(member, (*inside, name), visitor, budget, inflated=False, weak=True)
    member.drain()


def _tar(layer: _Layer, inside: tuple[str, ...], visitor: Visitor, budget: InflateBudget) -> None:
    # Past a block that is no header GNU tar skips on to the next one; so does ignore_zeros.
    with tarfile.open(fileobj=layer, mode="r|", ignore_zeros=True) as tar:  # type: ignore[call-overload]
        for member in tar:
            stream = tar.extractfile(member) if member.isfile() else None
            if stream is not None:  # a link, a directory, a device: no bytes of its own
                _read(stream, (*inside, member.name), visitor, budget, inflated=False, weak=True)


_CPIO_NEWC = (b"070701", b"070702")
_CPIO_ODC = b"070707"
_CPIO_TRAILER = "TRAILER!!!"


def _cpio(layer: _Layer, inside: tuple[str, ...], visitor: Visitor, budget: InflateBudget) -> None:
    """newc and crc (hexadecimal fields, 4-byte alignment) and odc (octal, none)."""
    first = True
    while True:
        magic = layer.peek(6)
        newc = magic in _CPIO_NEWC
        if not newc and magic != _CPIO_ODC:
            problem = f"no cpio header where one belongs ({magic!r})"
            if first:
                raise _NotThisKind(inside, f"began like cpio, but {problem}")
            raise Unreadable(f"{_where(inside)}: {problem}")
        header = read_exact(layer, 110 if newc else 76, f"{_where(inside)}: a cpio header")
        try:
            if newc:
                mode, name_size, size = (int(header[at : at + 8], 16) for at in (14, 94, 54))
            else:
                mode, name_size, size = (int(header[at:end], 8) for at, end in _ODC_FIELDS)
        except ValueError:
            if first:
                raise _NotThisKind(inside, "began like cpio, but its header is none") from None
            raise Unreadable(f"{_where(inside)}: a cpio header with junk fields") from None
        first = False
        raw_name = read_exact(layer, name_size, f"{_where(inside)}: a cpio name")
        name = raw_name.rstrip(b"\x00").decode(errors="surrogateescape")
        if newc:
            read_exact(layer, -(110 + name_size) % 4, f"{_where(inside)}: cpio padding")
        if name == _CPIO_TRAILER:
            return
        if mode & 0o170000 == 0o100000:  # a regular file: its bytes are its own layer
            _member(layer, size, name, inside, visitor, budget)
        else:  # a symlink's target, a hard link's data elsewhere: bytes of the archive
            _Limited(layer, size, _where((*inside, name))).drain()
        if newc:
            read_exact(layer, -size % 4, f"{_where(inside)}: cpio padding")


_ODC_FIELDS = ((18, 24), (59, 65), (65, 76))  # mode, name size, file size
_AR_MAGIC = b"!<arch>\n"


def _ar(layer: _Layer, inside: tuple[str, ...], visitor: Visitor, budget: InflateBudget) -> None:
    """An ar archive (a .deb is one): 60-byte headers, each member padded to an even size."""
    read_exact(layer, len(_AR_MAGIC), _where(inside))
    first = True
    while layer.peek(1):
        header = read_exact(layer, 60, f"{_where(inside)}: an ar header")
        try:
            if header[58:60] != b"`\n":
                raise ValueError
            size = int(header[48:58])
        except ValueError:
            if first:
                raise _NotThisKind(inside, "began like ar, but its first header is none") from None
            raise Unreadable(f"{_where(inside)}: an ar header that is none") from None
        first = False
        name = header[:16].decode(errors="surrogateescape").rstrip(" ")
        _member(layer, size, name.rstrip("/") or name, inside, visitor, budget)
        if size % 2:
            layer.read(1)  # the padding byte (a last member may lack it)


def _rest(
    layer: _Layer,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
    zip_from_start: bool,
    weak: bool,
) -> None:
    """The layer's bytes past what a container's reader read, to its end: each zip local
    header in them (a zip's members, or a zip after a prefix) is read as its member."""
    carry = b""
    first = zip_from_start
    while data := layer.read(CHUNK):
        window = carry + data
        at = window.find(ZIP_LOCAL) if (weak or zip_from_start) else -1
        if at < 0:
            carry = window[-(len(ZIP_LOCAL) - 1) :]
            continue
        layer.unread(window[at:])
        carry = b""
        if not _zip_member(layer, inside, visitor, budget, zip_from_start, first) and first:
            zip_from_start = False  # the layer only began like a zip
        first = False


def _zip_member(
    layer: _Layer,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
    proves: bool,
    first: bool,
) -> bool:
    """The zip member whose local header ``layer`` is at, read as its own layer; whether it
    was one. ``proves``: the layer began with a zip, so a member that breaks is
    ``Unreadable`` (but for a first one whose data breaks at once: a binary that began like a
    zip); in other bytes it is searched as bytes, with why. A header no zip tool writes is
    another file's bytes that happen to hold the signature."""
    at = layer.size - len(layer.pending)
    kind = zip_member_kind(layer.peek(30))
    where = "began like zip" if proves and first else f"a zip local header at byte {at}"
    if kind.problem is not None:
        layer.read(len(ZIP_LOCAL))
        if proves and kind.fatal:
            raise Unreadable(f"{_where(inside)}: {kind.problem}")
        if kind.fatal or (proves and first):
            visitor.as_bytes(inside, f"{where}, but {kind.problem}")
        return False
    if len(inside) >= MAX_DEPTH:
        layer.read(len(ZIP_LOCAL))
        too_deep = f"a zip nested deeper than {MAX_DEPTH} containers"
        if proves:
            raise Unreadable(f"{_where(inside)}: {too_deep}")
        visitor.as_bytes(inside, f"{where}: {too_deep}")
        return False
    try:
        _zip_data(layer, kind, inside, visitor, budget, proves, probing=proves and first)
    except _NotThisKind as error:
        if error.inside != inside:
            raise
        visitor.as_bytes(inside, f"{where}, but {error.reason}")
        return not (proves and first)
    return True


def _zip_data(
    layer: _Layer,
    kind: ZipMember,
    inside: tuple[str, ...],
    visitor: Visitor,
    budget: InflateBudget,
    proves: bool,
    probing: bool,
) -> None:
    owner = None if proves else inside
    header = _Limited(layer, 30 + kind.name_size + kind.extra_size, _where(inside), owner)
    fields = read_exact(header, 30 + kind.name_size + kind.extra_size, _where(inside))
    name = fields[30 : 30 + kind.name_size].decode(errors="surrogateescape")
    size = kind.compressed_size(fields[30 + kind.name_size :])
    if kind.stream is None and size is None:  # its length only in the descriptor after it
        visitor.as_bytes((*inside, name), "a stored zip member of unknown length: in place")
        return
    member = layer if size is None else _Limited(layer, size, _where((*inside, name)), owner)
    if kind.stream is None:
        _read(member, (*inside, name), visitor, budget, inflated=False, weak=True)
    else:
        properties = read_exact(member, kind.prefix, _where((*inside, name)))[4:]
        named = (*inside, name)
        decoded = _Decoded(member, kind.stream, inside, probing, proves, properties, named)
        _read(decoded, named, visitor, budget, inflated=True, weak=True)
    if isinstance(member, _Limited):
        member.drain()
