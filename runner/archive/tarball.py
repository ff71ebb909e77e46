"""``runner archive``: one reproducible, signed, credential-free tarball of a finished run.

The tarball holds every file of the run directory a reviewer needs (lock, resolution, schedule,
ledger, attempts, proxy records, trial directories, verify evidence, scan, the signed receipt
with its public key, the report) under ``<run name>/``, and ``archive-manifest.json`` naming
each file with its sha256 and size, signed by the lab operator (``archive-manifest.sig``). A
bulky file (trial trees, the audits' raw evidence, the report's pictures) over the size limit is
kept by digest only (in the manifest, not in the tarball); the records the check reads are always
kept whole. The scan's canary is left out (it is planted to be found). The bytes depend only on
the files: entries sorted, mtime 0, owner 0:0, mode 0644, gzip without name or time.

Before the tarball is moved into place, the credential scan (runner.scan.scan) runs over its own
bytes and over every member unpacked: any bearer-shaped string refuses the archive.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import Field

from runner.archive.tar_format import (
    MAX_UNPACKED_BYTES,
    Budget,
    Member,
    Spend,
    read_members,
    stream_bound,
)
from runner.core.canonical import canonical_json, file_digest
from runner.core.errors import InputError, RunnerError
from runner.core.files import read_model
from runner.core.models import FrozenModel, Sha256
from runner.records.paths import RunPaths
from runner.report.signing import OperatorKey, PublicKey, verify
from runner.scan.layers import InflateBudget
from runner.scan.scan import scan

MANIFEST = "archive-manifest.json"
MANIFEST_SIGNATURE = "archive-manifest.sig"
DEFAULT_SIZE_LIMIT = 32 << 20  # bytes; a larger bulky file is kept by digest only
MAX_RECORD_BYTES = 64 << 20  # the manifest: far above any real run's
MAX_SIGNATURE_BYTES = 64 << 10  # an armored SSHSIG: some 300 B, a few KiB for a large RSA key
# What the layers inside an archive's members may inflate, all together: the archive and its
# members are scanned twice (unpacked, and inside the tarball), both passes drawing from it.
MAX_SCAN_INFLATED_BYTES = 4 << 30


class ArchivedFile(FrozenModel):
    path: str = Field(description="relative to the run directory, POSIX")
    sha256: Sha256
    size: int = Field(ge=0)
    kept: bool = Field(description="False: over the size limit, kept by digest only")


class ArchiveManifest(FrozenModel):
    schema_version: Literal[1] = 1
    run: str = Field(description="the run directory's name, the tarball's top directory")
    size_limit: int = Field(ge=0)
    files: tuple[ArchivedFile, ...]
    left_out: tuple[str, ...] = Field(description="files of the run not archived: why each")
    signed_by: str = Field(description="the operator's SSH public key")

    def file(self, path: str) -> ArchivedFile | None:
        return next((entry for entry in self.files if entry.path == path), None)


def _left_out(paths: RunPaths, path: Path) -> str | None:
    """Why a file of the run directory never goes into an archive (None: it goes in)."""
    if path == paths.scan_canary:
        return "the credential scan's canary (planted to be found)"
    if path.is_symlink() and not path.resolve().is_relative_to(paths.run_dir.resolve()):
        return "a link out of the run directory"  # the host's files are not the run's
    return None


def _bulky(relative: Path) -> bool:
    """Where the bulk of a run lies: trial trees (a retried attempt's too), the audits' raw
    evidence, the report's pictures. Everything else is a record the check reads."""
    parts = relative.parts
    return (
        parts[0] in ("trials", "report-files")
        or relative.as_posix() in ("report.png", "report.html")
        or (parts[0] == "verify" and len(parts) > 2)
        or (parts[0] == "attempts" and parts[3:4] == ("trial",))
    )


def digest_only_problem(entry: ArchivedFile, size_limit: int) -> str | None:
    """Why ``entry`` may not be kept by digest only (None: it may): ``runner archive`` leaves
    out of the tarball only a bulky file over the size limit, so a key holder cannot hide a
    small one (a trial's result) to keep its outcome from being re-judged."""
    if entry.kept:
        return None
    if not _bulky(Path(entry.path)):
        return f"{entry.path}: a record the check reads, kept by digest only"
    if entry.size <= size_limit:
        return (
            f"{entry.path}: kept by digest only at {entry.size} B, within the manifest's size "
            f"limit ({size_limit} B)"
        )
    return None


def _run_files(paths: RunPaths) -> list[Path]:
    """Every file of the run directory (a link inside it as the file it names), sorted as
    the manifest and the tarball list them."""
    found = (
        Path(directory, name) for directory, _, names in os.walk(paths.run_dir) for name in names
    )
    return sorted(
        (path for path in found if path.is_file()),
        key=lambda path: path.relative_to(paths.run_dir).as_posix(),
    )


def archive_manifest(paths: RunPaths, key: OperatorKey, size_limit: int) -> ArchiveManifest:
    files, left_out = [], []
    for path in _run_files(paths):
        relative = path.relative_to(paths.run_dir)
        why = _left_out(paths, path)
        if why is not None:
            left_out.append(f"{relative.as_posix()}: {why}")
            continue
        size = path.stat().st_size
        files.append(
            ArchivedFile(
                path=relative.as_posix(),
                sha256=file_digest(path),
                size=size,
                kept=size <= size_limit or not _bulky(relative),
            )
        )
    return ArchiveManifest(
        run=paths.run_dir.name,
        size_limit=size_limit,
        files=tuple(files),
        left_out=tuple(left_out),
        signed_by=key.public,
    )


def _add(tar: tarfile.TarFile, name: str, size: int, data: BinaryIO) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, data)


def write_members(target: BinaryIO, members: Iterable[tuple[str, int, BinaryIO]]) -> None:
    """Each (name, size, bytes) as a member, in the format runner.archive.tar_format reads."""
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=target, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, size, data in members:
            _add(tar, name, size, data)


def write_tarball(target: BinaryIO, paths: RunPaths, manifest: ArchiveManifest, sig: bytes) -> None:
    """The tarball's bytes: the manifest and its signature first, then the kept files, sorted."""
    manifest_bytes = canonical_json(manifest) + b"\n"

    def members() -> Iterator[tuple[str, int, BinaryIO]]:
        for name, data in ((MANIFEST, manifest_bytes), (MANIFEST_SIGNATURE, sig)):
            yield f"{manifest.run}/{name}", len(data), io.BytesIO(data)
        for entry in manifest.files:
            if entry.kept:
                with (paths.run_dir / entry.path).open("rb") as handle:
                    yield f"{manifest.run}/{entry.path}", entry.size, handle

    write_members(target, members())


def unpack(archive: Path, into: Path, trusted: PublicKey | None = None) -> str:
    """Unpack the tarball under ``into`` and return its one top directory: one reading by
    runner.archive.tar_format, signature first. The manifest and its signature, the first two
    members, are held in memory within constant caps and the signature verified (with
    ``trusted``, or when None with the key the manifest names: check-archive's unpinned mode,
    whose receipt key is compared later) before another member is read; from then on the
    reading's budget is what the signed manifest lists, and each member must be one of its
    kept files, at its size, once, before a byte of it is written. A refused archive leaves
    nothing under ``into``."""
    unpacking = _Unpacking(archive, into, trusted)
    try:
        read_members(archive, unpacking.take, unpacking.budget)
        if unpacking.top is None or unpacking.left is None:
            raise InputError(f"{archive}: {MANIFEST_SIGNATURE} missing")
    except OSError as error:
        unpacking.remove()
        raise InputError(f"{archive}: cannot be read or unpacked: {error}") from None
    except InputError:
        unpacking.remove()
        raise
    return unpacking.top


class _Unpacking:
    """What ``unpack`` has read so far, and what the signed manifest still lets it write."""

    def __init__(self, archive: Path, into: Path, trusted: PublicKey | None) -> None:
        self.archive, self.into, self.trusted = archive, into, trusted
        self.top: str | None = None
        self.manifest_bytes = b""
        self.left: dict[str, int] | None = None  # kept files not yet written (None: unsigned)
        self.written: set[str] = set()
        self.created = False
        self.budget = Budget(
            {
                "inflated": stream_bound([MAX_RECORD_BYTES, MAX_SIGNATURE_BYTES]),
                "members": 2,
                "unpacked": MAX_RECORD_BYTES + MAX_SIGNATURE_BYTES,
            },
            f"before {MANIFEST_SIGNATURE} is verified",
        )

    def refuse(self, problem: str) -> InputError:
        return InputError(f"{self.archive}: {problem}")

    def take(self, member: Member) -> BinaryIO:
        if self.top is None:  # the first member: the manifest
            top, _, name = member.name.partition("/")
            if name != MANIFEST or member.size > MAX_RECORD_BYTES:
                raise self.refuse(
                    f"the first member is {member.name!r} of {member.size} B, `runner archive` "
                    f"writes <run>/{MANIFEST} (at most {MAX_RECORD_BYTES} B) first"
                )
            self.top = top
            return _Captured(member.size, self.keep_manifest)
        if self.left is None:  # the second: its signature, verified once read whole
            if member.name != f"{self.top}/{MANIFEST_SIGNATURE}" or (
                member.size > MAX_SIGNATURE_BYTES
            ):
                raise self.refuse(
                    f"the second member is {member.name!r} of {member.size} B, `runner archive` "
                    f"writes {self.top}/{MANIFEST_SIGNATURE} (at most {MAX_SIGNATURE_BYTES} B) "
                    "second"
                )
            return _Captured(member.size, self.verify)
        return self.file(member)

    def keep_manifest(self, data: bytes) -> None:
        self.manifest_bytes = data

    def verify(self, signature: bytes) -> None:
        """The manifest's signature holds: the budget becomes what the manifest lists."""
        if self.trusted is not None:
            problem = verify(self.manifest_bytes, signature, self.trusted)
            if problem is not None:
                raise InputError(
                    f"{MANIFEST_SIGNATURE}: not a signature of {MANIFEST} by the pinned key "
                    f"{self.trusted.fingerprint} ({problem})"
                )
        manifest = _parsed(self.archive, self.manifest_bytes)
        signer = PublicKey.parse(manifest.signed_by, f"{MANIFEST} signed_by")
        if self.trusted is None:
            problem = verify(self.manifest_bytes, signature, signer)
            if problem is not None:
                raise InputError(
                    f"{MANIFEST_SIGNATURE}: not the signature of {MANIFEST} by the key it names "
                    f"({problem})"
                )
        elif not self.trusted.same_key(signer):
            raise InputError(f"{MANIFEST}: signed_by {signer.fingerprint} is not the pinned key")
        if manifest.run != self.top:
            raise self.refuse(f"the top directory {self.top!r} is not the manifest's run")
        self.left = {entry.path: entry.size for entry in manifest.files if entry.kept}
        sizes = [len(self.manifest_bytes), len(signature), *self.left.values()]
        free = shutil.disk_usage(self.into if self.into.exists() else self.into.parent).free
        if sum(sizes) > min(MAX_UNPACKED_BYTES, free):
            raise self.refuse(
                f"its signed manifest lists {sum(sizes)} B to unpack, over the cap "
                f"({MAX_UNPACKED_BYTES} B) or the {free} B free"
            )
        caps: dict[Spend, int] = {
            "inflated": stream_bound(sizes),
            "members": len(sizes),
            "unpacked": sum(sizes),
        }
        self.budget.grant(caps, "what the signed manifest lists")
        (self.into / self.top).mkdir(parents=True)
        self.created = True
        for name, data in ((MANIFEST, self.manifest_bytes), (MANIFEST_SIGNATURE, signature)):
            (self.into / self.top / name).write_bytes(data)

    def file(self, member: Member) -> BinaryIO:
        """The member's file, opened once the signed manifest lists it at its size."""
        assert self.left is not None and self.top is not None
        top, _, relative = member.name.partition("/")
        if top != self.top:
            raise self.refuse(f"expected one top directory, found {sorted({top, self.top})!r}")
        if relative in self.written or relative in (MANIFEST, MANIFEST_SIGNATURE):
            raise self.refuse(f"two members are named {member.name!r}")
        if relative not in self.left:
            raise self.refuse(f"member {member.name!r} is not in the manifest")
        if member.size != self.left[relative]:
            raise self.refuse(
                f"member {member.name!r} is {member.size} B, the manifest says "
                f"{self.left[relative]} B"
            )
        del self.left[relative]
        self.written.add(relative)
        target = self.into / member.name
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open("xb")

    def remove(self) -> None:
        if self.created and self.top is not None:
            shutil.rmtree(self.into / self.top)


class _Captured(io.BytesIO):
    """A record's bytes, handed to ``keep`` when the reader closes it having written them all
    (closed early, the reading failed: its own error is the verdict)."""

    def __init__(self, size: int, keep: Callable[[bytes], object]) -> None:
        super().__init__()
        self._size, self._keep = size, keep

    def close(self) -> None:
        if not self.closed and self.tell() == self._size:
            self._keep(self.getvalue())
        super().close()


def _parsed(archive: Path, data: bytes) -> ArchiveManifest:
    try:
        return ArchiveManifest.model_validate_json(data)
    except ValueError as error:
        raise InputError(f"{archive}: {MANIFEST} is malformed: {error}") from None


def archive_finding(archive: Path, tree: Path) -> str | None:
    """The credential scan over the archive's bytes and over its members unpacked under
    ``tree``: no real key or bearer is known here, so what it finds is the bearer shape. A file
    the scan cannot read to its end (a truncated or corrupt compressed member) is a finding too:
    what it could not read may hold a bearer. None when there is neither; else the first of
    them, said in a line (the members first: they name the file).

    Both scans draw from one budget: the tar stream once (its length bounded by what unpack
    wrote, which the signed manifest listed) and ``MAX_SCAN_INFLATED_BYTES`` for every layer
    inside the members, however many members hold one."""
    written = [path.stat().st_size for path in tree.rglob("*") if path.is_file()]
    cap = stream_bound(written) + MAX_SCAN_INFLATED_BYTES
    budget = InflateBudget(cap, "the whole archive")
    reports = (
        scan([tree], {}, base=tree, budget=budget),
        scan([archive], {}, base=archive.parent, budget=budget),
    )
    leaks = [leak for report in reports for leak in report.leaks]
    failures = [failure for report in reports for failure in report.failures]
    more = len(leaks) + len(failures) - 1
    tail = f" ({more} more)" if more > 0 else ""
    if leaks:
        where = leaks[0].file + (f" (inside {leaks[0].inside})" if leaks[0].inside else "")
        return f"a {leaks[0].kind}-shaped string in {where}{tail}"
    if failures:
        return f"{failures[0].file} cannot be read to its end ({failures[0].error}){tail}"
    return None


def read_manifest(tree: Path) -> ArchiveManifest:
    return read_model(tree / MANIFEST, ArchiveManifest)


def write_archive(
    run_dir: Path, out: Path, size_limit: int = DEFAULT_SIZE_LIMIT
) -> ArchiveManifest:
    """Write the run's archive to ``out``, refused (nothing written) when its receipt is not
    signed by this operator's key or the scan of its bytes finds anything."""
    paths = RunPaths(run_dir)
    if not paths.run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    if out.resolve().is_relative_to(paths.run_dir.resolve()):
        raise InputError(f"{out}: the archive of {run_dir} cannot be written inside it")
    key = OperatorKey.default()
    if not paths.receipt_signature.is_file():
        raise InputError(f"{run_dir}: its receipt is not signed: run `runner report {run_dir}`")
    if paths.receipt_public_key.read_text().strip() != key.public:
        raise RunnerError(f"{paths.receipt_public_key}: the receipt was signed by another key")
    manifest = archive_manifest(paths, key, size_limit)
    signature = key.sign(canonical_json(manifest) + b"\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".archive-", dir=out.parent) as scratch:
        staged = Path(scratch, out.name)
        with staged.open("wb") as handle:
            write_tarball(handle, paths, manifest, signature)
        unpack(staged, Path(scratch, "tree"), key.key)
        finding = archive_finding(staged, Path(scratch, "tree"))
        if finding is not None:
            raise RunnerError(f"archive refused: the credential scan found {finding}")
        os.replace(staged, out)
    return manifest
