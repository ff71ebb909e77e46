"""Fetching artifacts into the store: skip what is there, download the rest, verify each.

A download streams into a temp file while it is hashed, is checked against the digest its
source states (Debian's and PyPI's sha256, npm's integrity) and only then renamed into the store.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import aiohttp
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from runner.artifacts.http import new_session, retrying
from runner.cache.store import ArtifactStore, CorruptArtifact, Integrity
from runner.core.errors import RunnerError

_PARALLEL_DOWNLOADS = 8
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Wanted:
    """A file to fetch and what its source states of it: a sha256, an npm integrity, or both,
    and its size if stated. ``unverified``: a file no index names, stored as it comes (the
    recording mirror's Debian archive files, which apt in the task's container checks)."""

    url: str
    filename: str
    sha256: str | None = None
    integrity: str | None = None
    size: int | None = None
    # Who states the digest, for the error line when the bytes differ.
    stated_by: str = "the source"
    unverified: bool = False

    def __post_init__(self) -> None:
        if self.sha256 is None and self.integrity is None and not self.unverified:
            raise ValueError(f"{self.url}: a download needs a digest to verify")


class Mismatch(CorruptArtifact):
    """The downloaded bytes are not what the source stated; what they are instead."""

    def __init__(self, message: str, sha256: str, size: int) -> None:
        super().__init__(message)
        self.sha256, self.size = sha256, size


@dataclass(frozen=True)
class Fetched:
    digest: str
    size: int


@dataclass
class FetchReport:
    """What a fetch did: how much came from the network and how much was already cached."""

    fetched: dict[str, Fetched]
    downloaded_files: int = 0
    downloaded_bytes: int = 0
    cached_files: int = 0
    cached_bytes: int = 0

    def summary(self) -> str:
        if not self.downloaded_files:
            return (
                f"downloaded nothing: all {self.cached_files} artifacts "
                f"({_megabytes(self.cached_bytes)}) were in the cache"
            )
        return (
            f"downloaded {self.downloaded_files} artifacts ({_megabytes(self.downloaded_bytes)}), "
            f"{self.cached_files} ({_megabytes(self.cached_bytes)}) were in the cache"
        )


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def cached_digest(store: ArtifactStore, wanted: Wanted) -> str | None:
    if wanted.sha256 is not None:
        return wanted.sha256 if store.has(wanted.sha256) else None
    assert wanted.integrity is not None
    return store.digest_for(Integrity.parse(wanted.integrity))


async def fetch_all(store: ArtifactStore, wanted: list[Wanted], console: Console) -> FetchReport:
    """Ensure every wanted file is in the store; keyed by URL in the report."""
    report = FetchReport(fetched={})
    missing: list[Wanted] = []
    for item in wanted:
        digest = cached_digest(store, item)
        if digest is None:
            missing.append(item)
            continue
        size = store.paths.blob(digest.removeprefix("sha256:")).stat().st_size
        report.fetched[item.url] = Fetched(digest, size)
        report.cached_files += 1
        report.cached_bytes += size
    if not missing:
        return report
    limit = asyncio.Semaphore(_PARALLEL_DOWNLOADS)
    with _progress(console) as progress:
        task = progress.add_task(f"0/{len(missing)} files", total=None)
        async with new_session() as session:

            async def one(item: Wanted) -> None:
                async with limit:
                    fetched = await _fetch(session, store, item, partial(progress.advance, task))
                report.fetched[item.url] = fetched
                report.downloaded_files += 1
                report.downloaded_bytes += fetched.size
                progress.update(task, description=f"{report.downloaded_files}/{len(missing)} files")

            await asyncio.gather(*(one(item) for item in missing))
    return report


async def _fetch(
    session: aiohttp.ClientSession,
    store: ArtifactStore,
    item: Wanted,
    advance: Callable[[int], None],
) -> Fetched:
    try:
        return await download(session, store, item, advance)
    except (aiohttp.ClientError, TimeoutError) as error:
        raise RunnerError(f"{item.url}: download failed: {error or 'timed out'}") from None


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]fetching artifacts[/] {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _advance_nothing(size: int) -> None:
    """A download nobody watches the progress of."""


async def download(
    session: aiohttp.ClientSession,
    store: ArtifactStore,
    item: Wanted,
    advance: Callable[[int], None] = _advance_nothing,
) -> Fetched:
    """``item`` streamed into the store while it is hashed, verified, then renamed in; retried
    as ``retrying`` says. Raises aiohttp's error for what the network did, ``Mismatch`` for
    bytes other than stated. ``advance`` is told the size of each chunk as it comes."""
    integrity = Integrity.parse(item.integrity) if item.integrity else None
    async for attempt in retrying():
        with attempt:
            return await _download_once(session, store, item, integrity, advance)
    raise AssertionError("unreachable: tenacity re-raises the last error")


async def _download_once(
    session: aiohttp.ClientSession,
    store: ArtifactStore,
    item: Wanted,
    integrity: Integrity | None,
    advance: Callable[[int], None],
) -> Fetched:
    temp = store.temp_path(item.filename)
    sha256 = hashlib.sha256()
    checked = hashlib.new(integrity.algorithm) if integrity else None
    size = 0
    try:
        async with session.get(item.url) as response:
            with temp.open("wb") as handle:
                async for chunk in response.content.iter_chunked(_CHUNK):
                    sha256.update(chunk)
                    if checked is not None:
                        checked.update(chunk)
                    handle.write(chunk)
                    size += len(chunk)
                    advance(len(chunk))
        _verify(item, sha256.hexdigest(), size, integrity, checked)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    digest = store.adopt(temp, sha256.hexdigest(), [integrity] if integrity else [])
    return Fetched(digest, size)


def _verify(
    item: Wanted,
    sha256_hex: str,
    size: int,
    integrity: Integrity | None,
    checked: hashlib._Hash | None,
) -> None:
    got = "sha256:" + sha256_hex
    if item.sha256 is not None and item.sha256 != got:
        raise Mismatch(
            f"{item.url}: sha256 is {got}, {item.stated_by} says {item.sha256}", got, size
        )
    if item.size is not None and item.size != size:
        raise Mismatch(f"{item.url}: {size} bytes, {item.stated_by} says {item.size}", got, size)
    if (
        integrity is not None
        and checked is not None
        and checked.hexdigest() != integrity.hex_digest
    ):
        raise Mismatch(
            f"{item.url}: {integrity.algorithm} does not match the source's integrity "
            f"{item.integrity}",
            got,
            size,
        )
