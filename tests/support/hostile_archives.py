"""Hostile archives of #34, each built from a genuine one (a finished run's, archived by
``runner archive``): the tar stream edited by an outsider (no key), its members repacked, or a
run directory edited and signed again by the holder of the operator's key. The tests build
them at a small scale, bench/archive_attacks.py at the issue's (GiBs, streamed, never held).
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO
from unittest import mock

from runner.archive import tarball as archive_module
from runner.archive.tar_format import BLOCK, RECORD
from runner.archive.tarball import ArchiveManifest, write_members, write_tarball
from runner.core.canonical import canonical_json
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.report.signing import OperatorKey
from runner.report.write import write_report

FORGED_LEDGER = b'{"forged": true}\n'
FORGED_REPORT = b"# every cell passed\n"
CHUNK = 1 << 20


# The tar stream, edited by an outsider.


def tar_stream(tarball: Path) -> bytes:
    return gzip.decompress(tarball.read_bytes())


def gzipped(stream: bytes) -> bytes:
    """``stream`` in the gzip member ``runner archive`` writes (no name, mtime 0)."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as zipped:
        zipped.write(stream)
    return out.getvalue()


def gzipped_chunks(out: Path, chunks: Iterable[bytes]) -> Path:
    """The chunks, one after another, as the gzip member ``runner archive`` writes, streamed:
    a stream of GiBs is never held."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc, total = 0, 0
    with out.open("wb") as handle:
        handle.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")
        for chunk in chunks:
            crc, total = zlib.crc32(chunk, crc), total + len(chunk)
            handle.write(deflate.compress(chunk))
        trailer = crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little")
        handle.write(deflate.flush() + trailer)
    return out


def members_end(stream: bytes) -> int:
    """Where the genuine members end and the end-of-archive blocks begin."""
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + padded(last.size)


def last_member_offset(tarball: Path) -> int:
    with tarfile.open(tarball) as tar:
        return tar.getmembers()[-1].offset


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def checksummed(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def header(name: str, size: int, **fields: bytes) -> bytes:
    """A header as tarfile writes it, then ``fields`` (name: bytes) written over it."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    block = bytearray(info.tobuf(tarfile.PAX_FORMAT))
    offsets = {"typeflag": 156, "linkname": 157, "devmajor": 329}
    for field, value in fields.items():
        block[offsets[field] : offsets[field] + len(value)] = value
    return checksummed(block)


def member(name: str, data: bytes, **fields: bytes) -> bytes:
    return header(name, len(data), **fields) + data + bytes(padded(len(data)) - len(data))


def ended(stream: bytes) -> bytes:
    """Two zero blocks and the record's padding after ``stream``, as tarfile closes one."""
    end = -(-(len(stream) + 2 * BLOCK) // RECORD) * RECORD
    return stream + bytes(end - len(stream))


def forged_after(tarball: Path, out: Path, *forged: bytes) -> tuple[Path, int]:
    """The genuine members, then ``forged`` blocks where the end of the archive was; and the
    offset of the first forged byte in the tar stream."""
    stream = tar_stream(tarball)
    end = members_end(stream)
    out.write_bytes(gzipped(ended(stream[:end] + b"".join(forged))))
    return out, end


def pax_header(records: bytes, size: int | None = None) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.size, info.type, info.mode = len(records) if size is None else size, tarfile.XHDTYPE, 0
    return info.tobuf(tarfile.USTAR_FORMAT)


def junk_devmajor(tarball: Path, out: Path) -> tuple[Path, int]:
    """Forged report and ledger behind a header whose devmajor field holds junk: tarfile ends
    the archive there, GNU tar ignores the field and unpacks them over the genuine ones."""
    return forged_after(
        tarball,
        out,
        member("run/report.md", FORGED_REPORT, devmajor=b"junk\x00\x00\x00\x00"),
        member("run/cells.jsonl", FORGED_LEDGER),
    )


def bad_checksum_block(tarball: Path, out: Path) -> tuple[Path, int]:
    """Forged report and ledger behind a block whose checksum is wrong: GNU tar warns
    'Skipping to next header' and unpacks them; tarfile stops."""
    return forged_after(
        tarball,
        out,
        b"J" * BLOCK,
        member("run/report.md", FORGED_REPORT),
        member("run/cells.jsonl", FORGED_LEDGER),
    )


def sparse_map(tarball: Path, out: Path) -> tuple[Path, int]:
    """A pax header whose GNU.sparse.map is junk (it ended the old check in a traceback)."""
    records = b"23 GNU.sparse.map=junk\n"
    return forged_after(
        tarball,
        out,
        pax_header(records) + records + bytes(BLOCK - len(records)),
        member("run/cells.jsonl", FORGED_LEDGER),
    )


def huge_pax_after(tarball: Path, out: Path, size: int) -> tuple[Path, int]:
    """The genuine members, then a pax header of ``size`` bytes (one comment: its gzip a few
    hundred KiB for 256 MiB) and a forged ledger; and where the genuine members end."""
    prefix = b"%d comment=" % size
    stream = tar_stream(tarball)
    end = members_end(stream)
    body = size - len(prefix) - 1

    def chunks() -> Iterator[bytes]:
        yield from (stream[:end], pax_header(b"", size), prefix)
        yield from (b"x" * CHUNK for _ in range(body // CHUNK))
        yield b"x" * (body % CHUNK) + b"\n"
        yield ended(member("run/cells.jsonl", FORGED_LEDGER))

    return gzipped_chunks(out, chunks()), end


def huge_pax_first(out: Path, size: int) -> Path:
    """A pax header of ``size`` bytes as the first header of all, nothing after it."""
    out.write_bytes(gzipped(ended(pax_header(b"", size))))
    return out


def declaring_huge_size(tarball: Path, out: Path, size: int) -> tuple[Path, int]:
    """The genuine archive's last member declaring ``size`` bytes (a sparse file's apparent
    size, say), no data following; and that member's offset. From 8 GiB on the size is in a
    pax header, as tarfile writes it."""
    with tarfile.open(tarball) as tar:
        name = tar.getnames()[-1]
    if size < 8**11:
        declared = header(name, size)
    else:
        records = b"%d size=%d\n" % (len(b"size=%d\n" % size) + 3, size)
        declared = pax_header(records) + records + bytes(BLOCK - len(records)) + header(name, 0)
    at = last_member_offset(tarball)
    out.write_bytes(gzipped(ended(tar_stream(tarball)[:at] + declared)))
    return out, at


# Members repacked in the archive's own format.


class Zeros(io.RawIOBase):
    """``size`` zero bytes, read in pieces (nothing of it held at once)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def packed(out: Path, members: Sequence[tuple[str, bytes | int]]) -> Path:
    """Members written in the archive's own format (runner.archive.tarball.write_members); a
    member given as an int is that many zeros, streamed."""

    def streams() -> Iterator[tuple[str, int, BinaryIO]]:
        for name, data in members:
            if isinstance(data, int):
                yield name, data, io.BufferedReader(Zeros(data), CHUNK)
            else:
                yield name, len(data), io.BytesIO(data)

    with out.open("wb") as handle:
        write_members(handle, streams())
    return out


def members_of(archive: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


def with_extra_member(archive: Path, out: Path, name: str, data: bytes | int, first: bool) -> Path:
    """The archive with one more member (its bytes, or that many zeros), before or after the
    genuine ones."""
    genuine = members_of(archive)
    return packed(out, [(name, data), *genuine] if first else [*genuine, (name, data)])


def manifest_listing_zeros(archive: Path, out: Path, size: int) -> Path:
    """The unsigned manifest edited to list ``run/zeros.bin`` of ``size`` zeros, packed with
    that member (2 GiB of zeros gzip to some 2 MiB): the old check wrote it all before it found
    the signature wrong."""
    members = members_of(archive)
    manifest = json.loads(members[0][1])
    digest = "sha256:" + "0" * 64
    manifest["files"].append({"path": "zeros.bin", "sha256": digest, "size": size, "kept": True})
    forged = (members[0][0], json.dumps(manifest).encode())
    return packed(out, [forged, *members[1:], ("run/zeros.bin", size)])


def nested_gzip(size: int) -> bytes:
    """A gzip of a gzip of ``size`` zeros, streamed (4 GiB of zeros: some 7 KB)."""
    inner = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    outer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros, parts = bytes(CHUNK), []
    for _ in range(size // CHUNK):
        parts.append(outer.compress(inner.compress(zeros)))
    parts.append(outer.compress(inner.compress(bytes(size % CHUNK)) + inner.flush()))
    return b"".join([*parts, outer.flush()])


# The run directory edited and signed again by the holder of the operator's key.


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    return copy


def signed_unscanned(run_dir: Path, out: Path) -> Path:
    """The run's archive as ``runner archive`` writes it, signed, but without its credential
    scan: what the key holder can write by hand, for the check to judge."""
    paths, key = RunPaths(run_dir), OperatorKey.default()
    manifest = archive_module.archive_manifest(paths, key, archive_module.DEFAULT_SIZE_LIMIT)
    with out.open("wb") as handle:
        write_tarball(handle, paths, manifest, key.sign(canonical_json(manifest) + b"\n"))
    return out


def first_trial(paths: RunPaths) -> Path:
    return next(paths.trials_dir.glob("*/trial-1"))


@contextmanager
def trial_results_digest_only() -> Iterator[None]:
    """``runner.archive.tarball`` marks every trial's small result.json digest-only (kept out of
    the tarball, its outcome not re-judged), under the size limit: the key holder's edit."""
    honest = archive_module.archive_manifest

    def hidden(*args: object) -> ArchiveManifest:
        manifest = honest(*args)  # type: ignore[arg-type]
        files = tuple(
            entry.model_copy(update={"kept": False})
            if entry.path.endswith("/result.json")
            else entry
            for entry in manifest.files
        )
        return manifest.model_copy(update={"files": files})

    with mock.patch.object(archive_module, "archive_manifest", hidden):
        yield


def rechained(paths: RunPaths, edit: Callable[[list[LedgerLine]], list[LedgerLine]]) -> None:
    """The ledger's lines edited, written again and linked afresh; the report signed again
    with the operator's key."""
    lines = edit(Ledger(paths).lines())
    paths.ledger.unlink()
    for line in lines:
        Ledger(paths).append(line)
    write_report(paths.run_dir)


def two_lines_swapped(lines: list[LedgerLine]) -> list[LedgerLine]:
    return [lines[0], lines[2], lines[1], *lines[3:]]
