"""The lab's package mirror: the frozen set of a resolution, served to the guest, and nothing else.

Task images build and verifiers set up inside the guest's containers, which reach this server at
``layout.GUEST_MIRROR_ADDRESS`` (a QEMU guestfwd to a host loopback port). It serves

    /debian/            a flat apt repository (``deb [trusted=yes] URL/debian ./``): Packages and
                        Release made from the resolution's .deb files (their control files)
    /debian/<codename>/ the same of the debs taken from another Debian release (a built base
                        image of that release has it as its apt source)
    /simple/<project>/  a PEP 503 index of the resolution's wheels, with their sha256
    /files/<wheel>      the wheels
    /debian/dists/..., /debian/pool/...
                        files of the Debian archive that a task's build or trial took by their
                        own path (a suite's signed index and a source package from a sources
                        line the task adds, the task containers reaching the lock's Debian
                        mirror's host name here), recorded

straight from the content-addressed artifact store, a file streamed from its blob with its
Content-Length (aiohttp.web, as the proxy; each request's blocking part, a blob's verification
or a recording's upstream fetch, in a thread of its own). Anything else is answered 404. Every
request is a line of the mirror log (JSON Lines; the cell runner reads the lines of its own
cell): what was asked, whether it is in the frozen set, and a ``miss`` for a package or project
the set does not have. apt's optional index files (InRelease, Translation-*, compressed
Packages) are answered 404 without counting as misses: apt asks for them on every update.

    python -m runner.lab.mirror --resolution FILE --port PORT --log FILE [--withhold NAME]

``--withhold`` serves the set minus the named packages (a fault for the tests: a verifier whose
dependency is missing must be ``verifier_setup``, not ``fail``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote

from aiohttp import web
from pydantic import Field

from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.apt_index import DebFile, packages_index, release_file
from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.core.models import FrozenModel
from runner.core.processes import start_listening
from runner.core.signals import take_sigterm
from runner.lab.state import LabPaths, load_lab_state
from runner.spec.base_images import DEBIAN_RELEASES
from runner.spec.resolution import (
    DEBIAN_FILE_KINDS,
    RECORDED_KINDS,
    PinnedArtifact,
    Resolution,
)

# apt asks for these on every update; the mirror has only Release and Packages.
_APT_OPTIONAL = re.compile(r"^(InRelease|Release\.gpg|Packages\.\w+|.*Translation-.*|by-hash/.*)$")
_NORMALIZE = re.compile(r"[-_.]+")
READY_SECONDS = 30.0
LOOPBACK = "127.0.0.1"
_CHUNK_BYTES = 1 << 20  # a blob is sent a MiB at a time
_ANSWER_THREADS = 64
_CONTENT_TYPES = {"index:simple": "text/html", "pypi": "text/html", "index": "text/plain"}
# What the mirror serves of a resolution: the guest's debs (an apt-get in a task image finds
# them too), the built base images' (with what the verifiers' apt-get needs on them), the wheels,
# and what task builds and trials recorded (runner.artifacts.recording).
DEB_KINDS = ("deb", "base-deb", "build-deb", "trial-deb")
SERVED_KINDS = (
    *DEB_KINDS, "wheel", "verifier-wheel", "build-python", "trial-python", *DEBIAN_FILE_KINDS,
)  # fmt: skip
# Paths of the Debian archive's own layout (as a sources line naming the Debian mirror asks).
_ARCHIVE_PATHS = ("dists/", "pool/")


class MirrorRequest(FrozenModel):
    """One line of the mirror log."""

    at: str
    method: str
    path: str
    status: int
    item: str = Field(description="deb:<file>, pypi:<project>, wheel:<file>, index:<file>, ...")
    miss: bool = Field(description="a package or project the frozen set does not have")
    upstream: bool = Field(
        default=False, description="not in the frozen set: served from upstream (recording)"
    )

    LATE_FIELDS = frozenset({"upstream"})


class Upstream(Protocol):
    """Where a recording mirror takes what the frozen set does not have (runner.artifacts.
    recording); the lab's own mirror has none and refuses it. Its methods may block on the
    network: the mirror calls them in threads, several at once."""

    def packages_index(self, frozen: bytes) -> bytes:
        """The apt index to serve: the frozen set's stanzas and the upstream's."""

    def file(self, kind: str, name: str) -> bytes | None:
        """A deb (its index path) or a PyPI file the frozen set lacks, fetched and recorded."""

    def project_files(self, name: str) -> list[tuple[str, str]] | None:
        """A project's files on the upstream index, ``(filename, sha256)`` each (None: it has
        none); any of them is then fetched and recorded when asked for."""

    def archive_file(self, path: str) -> bytes | None:
        """A file of the Debian archive by its path on the Debian mirror, fetched and recorded
        (None: the mirror has none)."""


def project_name(name: str) -> str:
    """PEP 503's normalized project name."""
    return _NORMALIZE.sub("-", name).lower()


@dataclass(frozen=True)
class FrozenSet:
    """What the mirror may serve: files by name, the apt index's stanzas, the simple index."""

    files: dict[str, PinnedArtifact]
    packages_index: bytes
    projects: dict[str, tuple[PinnedArtifact, ...]]
    # Another Debian release's index (/debian/<codename>/): only the debs taken from it, for a
    # built base image of that release (images.base), never the guest suite's.
    suite_indexes: dict[str, bytes]
    # Files of the Debian archive by their path on the Debian mirror (``dists/...``, ``pool/...``).
    archive: dict[str, PinnedArtifact]

    @classmethod
    def of(
        cls, resolution: Resolution, store: ArtifactStore, withhold: frozenset[str],
        recorded: bool = True,
    ) -> FrozenSet:  # fmt: skip
        """What ``resolution`` lets the mirror serve, but the projects of ``withhold``; without
        what tasks' builds and trials took when not ``recorded``."""
        kept = [
            artifact
            for artifact in resolution.artifacts
            if artifact.kind in SERVED_KINDS
            and project_name(artifact.name) not in withhold
            and (recorded or artifact.kind not in RECORDED_KINDS)
        ]
        archive = {a.name: a for a in kept if a.kind in DEBIAN_FILE_KINDS}
        kept = [artifact for artifact in kept if artifact.kind not in DEBIAN_FILE_KINDS]
        debs = [artifact for artifact in kept if artifact.kind in DEB_KINDS]
        other_releases = [suite for suite in DEBIAN_RELEASES if suite != resolution.suite]
        packages = _packages_index([d for d in debs if d.suite not in other_releases], store)
        projects: dict[str, list[PinnedArtifact]] = {}
        for artifact in kept:
            if artifact.kind not in DEB_KINDS:
                projects.setdefault(project_name(artifact.name), []).append(artifact)
        return cls(
            files={artifact.filename: artifact for artifact in kept},
            packages_index=packages,
            projects={name: tuple(items) for name, items in projects.items()},
            suite_indexes={
                suite: _packages_index([deb for deb in debs if deb.suite == suite], store)
                for suite in other_releases
            },
            archive=archive,
        )


def _packages_index(debs: list[PinnedArtifact], store: ArtifactStore) -> bytes:
    return packages_index(
        DebFile(store.blob(deb.sha256), deb.filename, deb.size, deb.sha256) for deb in debs
    )


def _release(packages: bytes) -> bytes:
    return release_file(packages, "frozen", "frozen-bench lab mirror")


class MirrorLog:
    """The JSON Lines log, appended line by line; written on the server's event loop only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, request: MirrorRequest) -> None:
        with self.path.open("a") as log:
            log.write(request.model_dump_json() + "\n")


def log_end(path: Path) -> int:
    """Where the log ends now: a cell's own requests are the lines after it."""
    return path.stat().st_size if path.is_file() else 0


def read_requests(path: Path, offset: int) -> tuple[tuple[MirrorRequest, ...], int]:
    """The log's lines from byte ``offset`` on, and the offset after them."""
    if not path.is_file():
        return (), offset
    with path.open("rb") as log:
        log.seek(offset)
        data = log.read()
    complete = data[: data.rfind(b"\n") + 1]
    lines = complete.decode().splitlines()
    return tuple(MirrorRequest.model_validate_json(line) for line in lines), offset + len(complete)


# A body: bytes made here or by the upstream, or a blob of the store (streamed); None: 404.
Body = bytes | Path | None


class Mirror:
    """What the mirror answers: the frozen set, and from ``upstream`` (recording mode only)
    what the set lacks."""

    def __init__(
        self,
        frozen: FrozenSet,
        store: ArtifactStore,
        log: MirrorLog,
        upstream: Upstream | None = None,
    ) -> None:
        self.frozen, self.store, self.log, self.upstream = frozen, store, log, upstream
        index = (
            frozen.packages_index
            if upstream is None
            else upstream.packages_index(frozen.packages_index)
        )
        self.packages_index, self.release = index, _release(index)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """GET and HEAD (uv asks before it downloads a wheel whether ranges are served: they
        are not); any other method is a 501, unlogged (no client of the mirror sends one)."""
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=501, text=f"Unsupported method ({request.method!r})\n")
        # Off the event loop: a blob is verified (read whole) before it is served, and the
        # recording upstream fetches over the network; other requests are answered meanwhile.
        body, item, miss = await asyncio.to_thread(self.answer, request.raw_path.split("?", 1)[0])
        from_upstream = body is not None and miss
        status = HTTPStatus.OK if body is not None else HTTPStatus.NOT_FOUND
        self.log.write(
            MirrorRequest(
                at=datetime.now(UTC).isoformat(timespec="milliseconds"),
                method=request.method,
                path=request.raw_path,
                status=status.value,
                item=item,
                miss=miss and not from_upstream,
                upstream=from_upstream,
            )
        )
        kind = item if item in _CONTENT_TYPES else item.split(":", 1)[0]
        content_type = _CONTENT_TYPES.get(kind, "application/octet-stream")
        if isinstance(body, Path):
            return await _blob_response(request, body, content_type)
        payload = body if body is not None else b"not in the frozen set\n"
        # Content-Length on every answer, a HEAD's too (aiohttp omits it for an empty body).
        headers = {"Content-Type": content_type, "Content-Length": str(len(payload))}
        return web.Response(status=status, body=payload, headers=headers)

    def answer(self, path: str) -> tuple[Body, str, bool]:
        """The body (None: 404), what was asked, and whether the frozen set lacks it (a body
        with a miss: recorded from upstream). Blocking: run it off the event loop."""
        # apt quotes a version's "~" (%7e) in a file's URL; the index names the file unquoted.
        parts = [unquote(part) for part in path.split("/") if part not in ("", ".")]
        if parts[:1] == ["debian"]:
            return self._debian("/".join(parts[1:]))
        if parts[:1] == ["simple"]:
            return self._simple(parts[1:])
        if parts[:1] == ["files"] and len(parts) == 2:
            return self._file(parts[1], "wheel")
        return None, f"other:{path}", True

    def _debian(self, name: str) -> tuple[Body, str, bool]:
        archived = self.frozen.archive.get(name)
        if archived is not None:
            return self.store.blob(archived.sha256), f"debian:{name}", False
        if name.startswith("dists/"):  # a real suite's index: the flat repository has none
            return self._archive(name)
        if name == "Packages":
            return self.packages_index, "index:Packages", False
        if name == "Release":
            return self.release, "index:Release", False
        suite, _, file = name.partition("/")
        if suite in self.frozen.suite_indexes and file in ("Packages", "Release"):
            index = self.frozen.suite_indexes[suite]
            return (index if file == "Packages" else _release(index)), f"index:{name}", False
        if _APT_OPTIONAL.match(file if suite in self.frozen.suite_indexes else name):
            return None, f"index:{name}", False
        answer = self._file(name, "deb")
        if answer[0] is None and name.startswith(_ARCHIVE_PATHS):
            return self._archive(name)  # a source package's file, say: not a binary of the index
        return answer

    def _archive(self, name: str) -> tuple[Body, str, bool]:
        """A file of the Debian archive the frozen set lacks: recorded from the Debian mirror
        in recording mode, else a miss."""
        body = self.upstream.archive_file(name) if self.upstream is not None else None
        return body, f"debian:{name}", True

    def _simple(self, parts: list[str]) -> tuple[Body, str, bool]:
        if not parts:
            links = "".join(
                f'<a href="{name}/">{name}</a>\n' for name in sorted(self.frozen.projects)
            )
            return (
                f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode(),
                "index:simple",
                False,
            )
        name = project_name(parts[0])
        frozen = [(f.filename, f.sha256) for f in self.frozen.projects.get(name, ())]
        # Recording: the upstream's files too, also of a project the set has at another
        # version (a trial's `pip install requests==2.32.5` beside Harbor's requests).
        upstream = self.upstream.project_files(name) if self.upstream is not None else None
        known = {filename for filename, _ in frozen}
        listed = frozen + [file for file in upstream or () if file[0] not in known]
        if not listed:
            return None, f"pypi:{name}", True
        return simple_page(listed), f"pypi:{name}", not frozen

    def _file(self, filename: str, kind: str) -> tuple[Body, str, bool]:
        artifact = self.frozen.files.get(filename.rsplit("/", 1)[-1])
        if artifact is None:
            body = self.upstream.file(kind, filename) if self.upstream is not None else None
            return body, f"{kind}:{filename}", True
        return self.store.blob(artifact.sha256), f"{kind}:{filename}", False


async def _blob_response(
    request: web.BaseRequest, blob: Path, content_type: str
) -> web.StreamResponse:
    """A blob of the store streamed in chunks with its Content-Length, never read whole (a
    wheel may be gigabytes). No Range, no conditional answer: uv and apt get the whole file."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    with blob.open("rb") as reader:
        response.content_length = os.fstat(reader.fileno()).st_size
        await response.prepare(request)
        if request.method != "HEAD":
            while chunk := await asyncio.to_thread(reader.read, _CHUNK_BYTES):
                await response.write(chunk)
    await response.write_eof()
    return response


def simple_page(files: Iterable[tuple[str, str]]) -> bytes:
    """A PEP 503 project page of (filename, sha256) links into the mirror's /files/."""
    links = "".join(
        f'<a href="../../files/{html.escape(filename)}#sha256='
        f'{sha256.removeprefix("sha256:")}">{html.escape(filename)}</a>\n'
        for filename, sha256 in files
    )
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()


def serve(
    resolution_file: Path,
    port: int,
    log_path: Path,
    withhold: frozenset[str] = frozenset(),
    upstream: Callable[[ArtifactStore], Upstream] | None = None,
) -> None:
    """Serve until stopped (SIGTERM, or the parent gone); ``upstream``: recording mode, where
    what the tasks' builds and trials took is not part of the set: a task's recording takes
    all it needs beyond the set from upstream and records it under its own name (a file an
    earlier recording of it or of another task took would otherwise go unrecorded for it, and
    be lost to it when that recording is replaced)."""
    store = ArtifactStore(CachePaths.default())
    resolution = read_model(resolution_file, Resolution)
    frozen = FrozenSet.of(resolution, store, withhold, recorded=upstream is None)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    answers = upstream(store) if upstream is not None else None
    asyncio.run(_serve_until_orphaned(Mirror(frozen, store, MirrorLog(log_path), answers), port))


async def start_server(mirror: Mirror, port: int) -> web.ServerRunner:
    """``mirror`` listening on 127.0.0.1:``port`` on the running loop; the caller cleans up."""
    # Requests wait in threads (a recording's upstream fetches, uv's parallel downloads): more
    # of them than asyncio's default pool of CPUs + 4, so a few slow fetches block no other.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(_ANSWER_THREADS, thread_name_prefix="mirror")
    )
    # aiohttp's low-level server, as the proxy's: handle answers every method and path itself.
    # Stopping, it waits for no answer: only an orphaned mirror stops this way.
    runner = web.ServerRunner(web.Server(mirror.handle, access_log=None), shutdown_timeout=0)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port).start()
    return runner


async def _serve_until_orphaned(mirror: Mirror, port: int) -> None:
    """A runner killed with SIGKILL cannot stop its mirror: the mirror stops itself when its
    parent is gone (it is re-parented), so the next runner finds the port free."""
    parent = os.getppid()
    runner = await start_server(mirror, port)
    try:
        while os.getppid() == parent:
            await asyncio.sleep(1)
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def running_mirror(
    resolution_file: Path, port: int, log_path: Path, withhold: tuple[str, ...] = ()
) -> Iterator[None]:
    """The mirror in a subprocess while the block runs (it must be up before the guest asks)."""
    process = start_mirror(resolution_file, port, log_path, withhold)
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def start_mirror(
    resolution_file: Path, port: int, log_path: Path, withhold: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start the mirror and return once it accepts connections; the caller stops it."""
    command = [
        sys.executable, "-m", "runner.lab.mirror", "--resolution", str(resolution_file),
        "--port", str(port), "--log", str(log_path),
        *(arg for name in withhold for arg in ("--withhold", name)),
    ]  # fmt: skip
    return start_listening(command, port, "the lab's package mirror", READY_SECONDS)


def _lab_port(lab: str) -> tuple[int, Path]:
    """The lab's mirror port (lab.json) and its mirror log."""
    paths = LabPaths.for_lab(lab)
    state = load_lab_state(paths)
    if state.mirror_port is None:
        raise RunnerError(f"lab {lab}: no mirror port in {paths.state}: deploy the lab again")
    return state.mirror_port, paths.mirror_log


def start_lab_mirror(lab: str, resolution_file: Path) -> subprocess.Popen[bytes]:
    """The lab's mirror started on its port; the caller stops it (deploy: when pyinfra exits)."""
    port, log = _lab_port(lab)
    return start_mirror(resolution_file, port, log)


@contextlib.contextmanager
def lab_mirror(lab: str, resolution_file: Path, withhold: tuple[str, ...] = ()) -> Iterator[Path]:
    """The lab's mirror on its port while the block runs; yields the lab's mirror log."""
    port, log = _lab_port(lab)
    with running_mirror(resolution_file, port, log, withhold):
        yield log


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.lab.mirror")
    parser.add_argument("--resolution", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--withhold", action="append", default=[])
    args = parser.parse_args()
    take_sigterm()  # running_mirror stops it with SIGTERM, whatever its parent ignored
    try:
        serve(args.resolution, args.port, args.log, frozenset(map(project_name, args.withhold)))
    except (RunnerError, OSError) as error:
        print(f"mirror: {error}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
