"""The credential scan of the guest's own disk, after every cell attempt.

A bearer enters the guest only in Harbor's environment (memory), the real key never: on the
guest's disk neither may be. After each attempt, before the next reset throws that disk away,
the host reads it (runner.lab.disk: the guest holds its filesystem frozen meanwhile) and
searches every file that changed since the freeze (a path the freeze's inventory lacks, or whose
ctime moved; the inventory's excluded paths, such as /var/log, are always read) for the real
keys, every bearer issued so far and the bearer shape, compressed files inside too
(runner.scan.scan's search). Each attempt's result is ``attempts/<cell>/guest-scan-<n>.json``;
the run's ``scan.json`` takes their leaks and failures in, so a secret on the guest's disk makes
the receipt ``failed_closed``, naming the path. A guest disk that could not be read is a failure
of the scan, as any file that could not be read through is. An attempt whose runner was killed
is scanned by the run that resumes it, before that run's first reset.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import ClassVar, Literal, TypeVar

from pydantic import Field

from runner.core.files import read_model, write_model
from runner.core.models import FrozenModel, Sha256, updated
from runner.freeze.inventory import DiskInventory, walk
from runner.records.ledger import AttemptRecord, Ledger
from runner.records.paths import RunPaths
from runner.scan.scan import (
    FileScan,
    Findings,
    Leak,
    ScanFailure,
    SearchedAsBytes,
    Searcher,
    SecretKind,
)

GUEST_PREFIX = "guest:"
# Where a cell's own bearer is on the guest's disk by design: Harbor hands it to the agent as
# the environment of a `docker exec`, and Podman keeps each exec session's configuration in its
# database (SQLite, with its journal files) and, while the exec runs, its spec in a file of the
# container's userdata (left behind when the runner is killed mid-exec), until the reset.
# Patterns of whole guest paths, one path component a ``*``. The cell's own bearer there (known
# by the digest in its attempt's record) is recorded as expected, not as a leak; another bearer
# there, the real key, and any bearer anywhere else are leaks.
BEARER_EXPECTED_IN = (
    "/var/lib/containers/storage/db.sql*",
    "/var/lib/containers/storage/overlay-containers/*/userdata/*/exec-process-*",
)


class GuestScan(FrozenModel):
    schema_version: Literal[1] = 1
    cell: str
    attempt: int = Field(ge=1)
    scanned_at: datetime
    files_scanned: int = Field(ge=0)
    bytes_scanned: int = Field(ge=0)
    leaks: tuple[Leak, ...]
    failures: tuple[ScanFailure, ...]
    # Bearers found where they are by design (BEARER_EXPECTED_IN): named, not leaks.
    expected_bearers: tuple[str, ...] = ()
    searched_as_bytes: tuple[SearchedAsBytes, ...] = ()

    LATE_FIELDS: ClassVar[frozenset[str]] = frozenset({"searched_as_bytes"})


@dataclass(frozen=True)
class DiskFindings:
    files: int
    bytes: int
    leaks: tuple[Leak, ...]
    failures: tuple[ScanFailure, ...]
    expected_bearers: tuple[str, ...] = ()
    searched_as_bytes: tuple[SearchedAsBytes, ...] = ()


def bearer_expected(path: PurePosixPath) -> bool:
    """Whether a guest path is one where the cell's own bearer is by design."""
    return any(path.match(pattern) for pattern in BEARER_EXPECTED_IN)


def changed_files(root: Path, inventory: DiskInventory) -> Iterator[Path]:
    """Every regular file of the disk mounted at ``root`` that is not as the freeze left it."""
    for path, host, info in walk(root, ()):
        if stat.S_ISREG(info.st_mode) and inventory.ctimes.get(path) != info.st_ctime_ns:
            yield Path(host)


def scan_disk(
    root: Path,
    inventory: DiskInventory,
    secrets_by_kind: Mapping[SecretKind, tuple[str, ...]],
    own_bearer: Sha256 | None = None,
) -> DiskFindings:
    """The secrets in the changed files of the guest disk at ``root``, named ``guest:/<path>``;
    ``own_bearer``: the digest of the attempt's own bearer, expected in BEARER_EXPECTED_IN."""
    scan = FileScan(root, Searcher(secrets_by_kind))  # one inflate budget for the disk
    expecting = Searcher(secrets_by_kind, frozenset({own_bearer} if own_bearer else ()))
    for path in changed_files(root, inventory):
        guest_path = PurePosixPath("/", path.relative_to(root))
        scan.file(path, expecting if bearer_expected(guest_path) else None)
    return DiskFindings(
        files=scan.files,
        bytes=scan.bytes,
        leaks=_renamed(scan.leaks, before=f"{GUEST_PREFIX}/"),
        expected_bearers=tuple(f"{GUEST_PREFIX}/{file}" for file in scan.own_bearers),
        failures=_renamed(scan.failures, before=f"{GUEST_PREFIX}/"),
        searched_as_bytes=_renamed(scan.as_bytes, before=f"{GUEST_PREFIX}/"),
    )


_Named = TypeVar("_Named", Leak, ScanFailure, SearchedAsBytes)


def _renamed(entries: Iterable[_Named], before: str = "", after: str = "") -> tuple[_Named, ...]:
    """The entries, each file named with ``before`` and ``after`` around it."""
    return tuple(updated(e, file=before + e.file + after) for e in entries)


def own_bearer(paths: RunPaths, cell: str, attempt: int) -> Sha256 | None:
    """The digest of the bearer the attempt was issued, from its record (None: never issued,
    or recorded before records kept it)."""
    return read_model(paths.attempt(cell, attempt), AttemptRecord).bearer_sha256


def record_guest_scan(paths: RunPaths, cell: str, attempt: int, findings: DiskFindings) -> None:
    write_model(
        paths.guest_scan(cell, attempt),
        GuestScan(
            cell=cell,
            attempt=attempt,
            scanned_at=datetime.now(UTC),
            files_scanned=findings.files,
            bytes_scanned=findings.bytes,
            leaks=findings.leaks,
            failures=findings.failures,
            expected_bearers=findings.expected_bearers,
            searched_as_bytes=findings.searched_as_bytes,
        ),
    )


def unreadable(error: Exception) -> DiskFindings:
    """The findings of a guest disk that could not be read: a failure of the scan."""
    return DiskFindings(0, 0, (), (ScanFailure(file=f"{GUEST_PREFIX}/", error=str(error)),))


def last_unscanned_attempt(ledger: Ledger) -> tuple[str, int] | None:
    """(cell, attempt) of the run's latest attempt, when its guest disk was never scanned (its
    runner was killed): a resumed run scans the guest for it before its first reset."""
    records = [
        record
        for cell in sorted(path.name for path in ledger.paths.attempts_dir.glob("*/"))
        for record in ledger.attempts(cell)
    ]
    if not records:
        return None
    last = max(records, key=lambda record: record.started_at)
    if ledger.paths.guest_scan(last.cell_id, last.attempt).exists():
        return None
    return last.cell_id, last.attempt


def guest_findings(paths: RunPaths) -> Findings:
    """Every attempt's guest-disk leaks, failures and layers searched as bytes, each named with
    its cell and attempt."""
    found = Findings()
    for file in paths.guest_scans:
        scan = read_model(file, GuestScan)
        where = f" (cell {scan.cell}, attempt {scan.attempt})"
        found = Findings(
            found.leaks + _renamed(scan.leaks, after=where),
            found.failures + _renamed(scan.failures, after=where),
            found.searched_as_bytes + _renamed(scan.searched_as_bytes, after=where),
        )
    return found
