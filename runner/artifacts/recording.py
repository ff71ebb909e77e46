"""The lab's mirror in recording mode: what a task's build or trial asks for beyond the frozen
set is fetched from the registries the host reaches, checked, kept and recorded.

The lab's own mirror (runner.lab.mirror) serves the frozen set and refuses anything else. To
learn what a task's image build and its trial need, ``runner resolve LOCK --lab LAB`` builds it
and runs its oracle once against this mirror instead (runner.artifacts.task_builds): apt's flat
index is the frozen set's stanzas followed by the guest suite's own (from apt's signature-
checked lists), so a ``Filename: pool/...`` apt asks for is fetched from the Debian mirror and
must match the index's SHA256 and size; a PyPI project's simple-index page lists the set's files
and the upstream's (from its PEP 691 JSON), and a file pip or uv then takes that the set lacks is
fetched and must match the sha256 the upstream listed. Each file is added to the artifact store
and recorded as a ``build-*`` or ``trial-*`` artifact (``--phase``) of the task (``tasks``);
``merge_recorded`` puts the record into the resolution. Nothing is recorded that was not served,
and a fetch that fails is a 404 to the build, its error in the record.

    python -m runner.artifacts.recording --resolution FILE --port PORT --log FILE
        --record FILE --task ID --phase build|trial --debian-mirror URL --packages FILE
        --python-index URL --suite SUITE
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import aiohttp
from debian.deb822 import Packages
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from pydantic import Field, TypeAdapter, ValidationError

from runner.artifacts.fetch import Mismatch, Wanted, download
from runner.artifacts.http import get_json, new_session
from runner.cache.store import ArtifactStore
from runner.core.errors import RunnerError, describe_validation_error
from runner.core.models import FrozenModel, updated
from runner.core.signals import take_sigterm
from runner.lab.mirror import serve
from runner.spec.resolution import RECORDED_KINDS, ArtifactKind, PinnedArtifact, Resolution

_T = TypeVar("_T")
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# What a recording is of, and the kinds it records a deb, a Python file and a file of the
# Debian archive taken by its path as: a task's image build, or its trial (the oracle: its
# reference solution and its verifier) on that image.
PHASE_KINDS: dict[str, tuple[ArtifactKind, ArtifactKind, ArtifactKind]] = {
    "build": ("build-deb", "build-python", "build-debian-file"),
    "trial": ("trial-deb", "trial-python", "trial-debian-file"),
}


class RecordedFailure(FrozenModel):
    """A file the build asked for that the upstream could not give as its index said."""

    kind: Literal["fetch-failure"] = "fetch-failure"
    url: str
    error: str


# A line of a recording, told apart by its kind: an artifact served (its kind is the artifact's)
# or a fetch that failed.
RecordLine = Annotated[PinnedArtifact | RecordedFailure, Field(discriminator="kind")]
_RECORD_LINE: TypeAdapter[PinnedArtifact | RecordedFailure] = TypeAdapter(RecordLine)


@dataclass
class _Record:
    """What was served from upstream, appended as JSON Lines as it happens (one writer)."""

    path: Path
    task: str
    phase: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, line: RecordLine) -> None:
        with self.lock, self.path.open("a") as record:
            record.write(line.model_dump_json() + "\n")


@dataclass(frozen=True)
class _Listed:
    """A file an upstream index lists: where it is, and what it must be."""

    url: str
    sha256: str
    size: int | None
    name: str
    version: str


def _in_loop(work: Callable[[aiohttp.ClientSession], Awaitable[_T]]) -> _T:
    """``work`` run with a session of its own (the mirror answers each request in a thread)."""

    async def run() -> _T:
        async with new_session() as session:
            return await work(session)

    return asyncio.run(run())


def _project_files(index: str, name: str) -> list[dict[str, object]] | None:
    async def fetch(session: aiohttp.ClientSession) -> list[dict[str, object]] | None:
        page = await get_json(session, f"{index.rstrip('/')}/{name}/", _SIMPLE_JSON)
        return None if page is None else list(page.get("files", []))

    return _in_loop(fetch)


def _python_version(filename: str) -> str | None:
    try:
        return str(parse_wheel_filename(filename)[1])
    except InvalidWheelFilename:
        pass
    try:
        return str(parse_sdist_filename(filename)[1])
    except InvalidSdistFilename:
        return None


class RecordingUpstream:
    """runner.lab.mirror's Upstream: the Debian suite's index and a PyPI index, recorded."""

    def __init__(
        self, store: ArtifactStore, record: _Record, debian_mirror: str, packages: bytes,
        python_index: str, suite: str,
    ) -> None:  # fmt: skip
        self.store, self.record, self.suite = store, record, suite
        self.debian_mirror, self.python_index = debian_mirror.rstrip("/"), python_index
        self.upstream_packages = packages
        self.debs: dict[str, _Listed] = {}
        for stanza in Packages.iter_paragraphs(packages.decode(), use_apt_pkg=False):
            self.debs[stanza["Filename"]] = _Listed(
                f"{self.debian_mirror}/{stanza['Filename']}", "sha256:" + stanza["SHA256"],
                int(stanza["Size"]), stanza["Package"], stanza["Version"],
            )  # fmt: skip
        self.python_files: dict[str, _Listed] = {}
        self._lock = threading.Lock()

    def packages_index(self, frozen: bytes) -> bytes:
        """The frozen set's stanzas first, a blank line between (apt's stanza separator)."""
        if not frozen:
            return self.upstream_packages
        return frozen.rstrip(b"\n") + b"\n\n" + self.upstream_packages

    def project_files(self, name: str) -> list[tuple[str, str]] | None:
        files = _project_files(self.python_index, name)
        if not files:
            return None
        listed = []
        for entry in files:
            filename, hashes = str(entry["filename"]), entry.get("hashes")
            sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
            version = _python_version(filename)
            if sha256 is None or version is None or entry.get("yanked"):
                continue
            url = str(entry["url"])
            size = entry.get("size")
            with self._lock:
                self.python_files[filename] = _Listed(
                    url, f"sha256:{sha256}", int(size) if isinstance(size, int) else None,
                    name, version,
                )  # fmt: skip
            listed.append((filename, f"sha256:{sha256}"))
        return listed

    def file(self, kind: str, name: str) -> bytes | None:
        deb_kind, python_kind, _ = PHASE_KINDS[self.record.phase]
        if kind == "deb":
            listed, filename, kind_taken = self.debs.get(name), name.rsplit("/", 1)[-1], deb_kind
        else:
            with self._lock:
                listed = self.python_files.get(name)
            filename, kind_taken = name, python_kind
        if listed is None:
            return None
        wanted = Wanted(
            listed.url, filename, listed.sha256, size=listed.size, stated_by="the index"
        )
        return self._take(wanted, kind_taken, listed.name, listed.version)

    def archive_file(self, path: str) -> bytes | None:
        """A file of the Debian archive by its path, as the Debian mirror has it today. No index
        names it beforehand: apt in the task's container checks it (a suite's InRelease against
        the image's keyring, every other file against the index that names it), and what it
        took is recorded byte for byte; one the mirror does not have is a 404, not recorded.
        A binary package is never taken this way: it comes checked against its index or not
        at all."""
        if path in self.debs or path.endswith((".deb", ".udeb")):
            return None
        url, filename = f"{self.debian_mirror}/{path}", path.rsplit("/", 1)[-1]
        kind = PHASE_KINDS[self.record.phase][2]
        return self._take(Wanted(url, filename, unverified=True), kind, path, None)

    def _take(
        self, wanted: Wanted, kind: ArtifactKind, name: str, version: str | None
    ) -> bytes | None:
        """``wanted`` downloaded into the store and recorded as ``kind`` ``name`` at ``version``
        (None: the file's own digest names it); a failure recorded instead, and None. A file no
        index names that the mirror does not have (404) is no failure: apt asks for such."""
        try:
            fetched = _in_loop(lambda session: download(session, self.store, wanted))
        except aiohttp.ClientResponseError as error:
            if not (wanted.unverified and error.status == 404):
                self._failed(wanted, f"{error.status} {error.message}")
            return None
        except (aiohttp.ClientError, TimeoutError) as error:
            self._failed(wanted, str(error) or "timed out")
            return None
        except Mismatch as error:
            self._failed(
                wanted, f"got {error.sha256} ({error.size} bytes), the index says {wanted.sha256}"
            )
            return None
        self.record.write(
            PinnedArtifact(
                kind=kind,
                name=name,
                version=version if version is not None else fetched.digest[7:19],
                url=wanted.url,
                filename=wanted.filename,
                sha256=fetched.digest,
                size=fetched.size,
                suite=self.suite if kind == PHASE_KINDS[self.record.phase][0] else None,
                tasks=(self.record.task,),
            )
        )
        return self.store.paths.blob(fetched.digest.removeprefix("sha256:")).read_bytes()

    def _failed(self, wanted: Wanted, error: str) -> None:
        self.record.write(RecordedFailure(url=wanted.url, error=error))


def read_record(path: Path) -> tuple[tuple[PinnedArtifact, ...], tuple[RecordedFailure, ...]]:
    """The artifacts a recording served, and the fetches that failed."""
    served, failed = [], []
    lines = path.read_text().splitlines() if path.is_file() else []
    for number, line in enumerate(lines, 1):
        try:
            read = _RECORD_LINE.validate_json(line)
        except ValidationError as error:
            raise RunnerError(describe_validation_error(f"{path}:{number}", error)) from None
        if isinstance(read, RecordedFailure):
            failed.append(read)
        else:
            served.append(read)
    return tuple(served), tuple(failed)


def carried_records(
    previous: tuple[PinnedArtifact, ...], task_ids: tuple[str, ...]
) -> tuple[PinnedArtifact, ...]:
    """What earlier recorded builds and trials took, for the tasks still in the lock: a fresh
    resolution keeps them (only a new recording changes them)."""
    kept = []
    for artifact in previous:
        tasks = tuple(task for task in artifact.tasks if task in task_ids)
        if artifact.kind in RECORDED_KINDS and tasks:
            kept.append(updated(artifact, tasks=tasks))
    return tuple(kept)


def merge_recorded(
    resolution: Resolution, recorded: tuple[PinnedArtifact, ...], recorded_tasks: Iterable[str]
) -> Resolution:
    """``resolution`` with the recorded files: one artifact per file, naming every task whose
    build or trial took it; what ``recorded_tasks`` took now replaces what the resolution said
    of them before (a task that took nothing this time keeps nothing)."""
    tasks = {*recorded_tasks, *(task for artifact in recorded for task in artifact.tasks)}
    kept: dict[str, PinnedArtifact] = {}
    for artifact in resolution.artifacts:
        if artifact.kind in RECORDED_KINDS:
            others = tuple(task for task in artifact.tasks if task not in tasks)
            if not others:
                continue
            artifact = updated(artifact, tasks=others)
        kept[f"{artifact.kind}:{artifact.sha256}"] = artifact
    for artifact in recorded:
        key = f"{artifact.kind}:{artifact.sha256}"
        if key in kept:
            merged = tuple(sorted({*kept[key].tasks, *artifact.tasks}))
            artifact = updated(kept[key], tasks=merged)
        kept[key] = artifact
    ordered = sorted(kept.values(), key=lambda artifact: artifact.sort_key)
    content = resolution.model_dump(mode="json", exclude={"environment_fingerprint"})
    # Validated again without its fingerprint: the new artifacts give the new one.
    return Resolution.model_validate(
        {**content, "artifacts": [artifact.model_dump(mode="json") for artifact in ordered]}
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.artifacts.recording")
    for option in ("--resolution", "--log", "--record", "--packages"):
        parser.add_argument(option, type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    for option in ("--task", "--debian-mirror", "--python-index", "--suite"):
        parser.add_argument(option, required=True)
    parser.add_argument("--phase", choices=sorted(PHASE_KINDS), required=True)
    args = parser.parse_args()
    take_sigterm()  # stopped with SIGTERM, as the lab's own mirror

    def upstream(store: ArtifactStore) -> RecordingUpstream:
        return RecordingUpstream(
            store, _Record(args.record, args.task, args.phase), args.debian_mirror,
            args.packages.read_bytes(), args.python_index, args.suite,
        )  # fmt: skip

    try:
        serve(args.resolution, args.port, args.log, upstream=upstream)
    except (RunnerError, OSError) as error:
        print(f"recording mirror: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
