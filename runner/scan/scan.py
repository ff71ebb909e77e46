"""The credential scan: no real key and no bearer may survive in anything a run keeps.

After a run, every file under the retained roots (the whole run directory by default: ledger,
attempts, trials with the agents' logs and sessions, proxy counts, verify, receipt) is searched
for every real key and every bearer the proxy issued (handed over in memory, never written
down), for a planted canary, and for any string of the bearer shape (``runner.proxy.bearer``,
also split by a line break or a colour code): that catches bearers issued by an earlier runner
process, which a resumed run never knew. Every container the guest's own tools open is searched
inside as well, layer within layer to a stated depth, all files within one inflate budget
(runner.scan.layers), and file and member names too. Every secret is searched for as UTF-8
(raw and JSON-escaped), UTF-16 and UTF-32 text (either byte order), and in what each stretch of
text that could encode one decodes to (runner.core.secret_forms: base64, hex, hex dumps,
percent and ``\\u``/``\\x`` escapes), two encodings deep; base64 or hex of a container is
opened too. The report names the file and the kind of secret, never the secret: a secret in a
name is shown as ``<kind>``.

A leak makes the scan unclean, and so does a file that could not be read through, and so does
a canary that was planted but not found (a scan that cannot find its canary proves nothing). A
layer that began like a container but was none is searched as bytes and listed, with why
(``searched_as_bytes``): no finding, but no silence either.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from runner.core.canonical import sha256_digest
from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.core.models import FrozenModel
from runner.core.secret_forms import decoded_views, encoded_runs, run_views
from runner.proxy.bearer import (
    BEARER_LENGTH,
    BEARER_SHAPE,
    BEARER_SPLITS,
    SPLIT_BEARER_SHAPE,
    shape_in,
)
from runner.records.paths import RunPaths
from runner.scan.layer_kinds import HEAD, may_be_proven, proven_kind
from runner.scan.layers import READ_ERRORS, InflateBudget, read_layers

SecretKind = Literal["provider_key", "bearer", "canary"]
# What a search finds: a kind of secret, or a bearer of the shape known to be where it is by
# design (runner.scan.guest_disk: a cell's own bearer in Podman's records), which no report
# names as a leak.
Found = SecretKind | Literal["own_bearer"]

MIN_SECRET_LENGTH = 12  # shorter strings would match by chance


class Leak(FrozenModel):
    file: str
    kind: SecretKind
    inside: str | None = Field(default=None, description="the compressed member it was found in")


class ScanFailure(FrozenModel):
    file: str
    error: str


class SearchedAsBytes(FrozenModel):
    """A layer that began like a container but was searched as bytes only, and why."""

    file: str
    layer: str | None = Field(default=None, description="where in the file; None: the file")
    reason: str


class ScanReport(FrozenModel):
    schema_version: Literal[1] = 1
    scanned_at: datetime
    roots_scanned: tuple[str, ...]
    missing_roots: tuple[str, ...]
    files_scanned: int = Field(ge=0)
    bytes_scanned: int = Field(ge=0)
    secrets_checked: dict[SecretKind, int] = Field(description="how many of each kind")
    leaks: tuple[Leak, ...]
    canary_planted: bool
    canary_hits: tuple[str, ...]
    failures: tuple[ScanFailure, ...]
    clean: bool
    searched_as_bytes: tuple[SearchedAsBytes, ...] = ()

    LATE_FIELDS: ClassVar[frozenset[str]] = frozenset({"searched_as_bytes"})

    @model_validator(mode="after")
    def _clean_follows_findings(self) -> ScanReport:
        expected = (
            not self.leaks
            and not self.failures
            and (not self.canary_planted or bool(self.canary_hits))
        )
        if self.clean != expected:
            raise ValueError(f"clean must be {expected} for these findings")
        return self


def new_canary() -> str:
    """A string that must be found where it is planted, and nowhere by chance."""
    return "scan-canary-" + secrets.token_urlsafe(24)


def _forms(value: str) -> set[str]:
    """The secret as stored raw, and as it appears inside a JSON string."""
    return {value, json.dumps(value)[1:-1]}


# Encodings other than UTF-8 that text is searched in: each gives an ASCII character one code
# unit, its byte between NULs (a BOM before the text changes nothing inside it).
WIDE_ENCODINGS = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
# Encodings inside encodings searched (base64 of base64, a %-escaped base64, ...).
ENCODING_DEPTH = 2
# The forms whose decoded bytes may be a container (base64 of a gzip): opened as a file is.
_BINARY_FORMS = frozenset({"base64", "hex", "hex dump"})
_VIEWS_APART = b"\x00\n"
_DOTS = re.compile(rb"[.~]")
# Bytes of text a secret's longest form takes per byte of it: a \u escape (6) of base64 (4/3).
_LONGEST_FORM = 8

# Opens the container a decoded view holds (form, bytes, depth of encodings it is at): the
# kinds found inside.
ViewOpener = Callable[[str, bytes, int], set["Found"]]


class Searcher:
    """Searches windows of bytes for the secrets; a bearer-shaped string whose digest
    (``sha256:<hex>``) is one of ``own_bearers`` is found as ``own_bearer``, not as a bearer."""

    def __init__(
        self,
        secrets_by_kind: Mapping[SecretKind, Iterable[str]],
        own_bearers: frozenset[str] = frozenset(),
    ) -> None:
        self.own_bearers = own_bearers
        forms: list[tuple[str, SecretKind]] = []
        self.checked: dict[SecretKind, int] = {}
        for kind, values in secrets_by_kind.items():
            distinct = set(values)
            for value in distinct:
                if len(value) < MIN_SECRET_LENGTH:
                    raise RunnerError(
                        f"scan: a {kind} shorter than {MIN_SECRET_LENGTH} "
                        "characters cannot be searched for reliably"
                    )
                # A bearer the proxy issued has the shape, which finds it (and every other):
                # searching for each one too would only cost time.
                if kind != "bearer" or not BEARER_SHAPE.fullmatch(value.encode()):
                    forms += [(form, kind) for form in _forms(value)]
            self.checked[kind] = len(distinct)
        self.needles = [(form.encode(), kind) for form, kind in forms]
        self.wide_needles = [(f.encode(e), k) for f, k in forms for e in WIDE_ENCODINGS]
        self.wide_shapes = [shape_in(encoding) for encoding in WIDE_ENCODINGS]
        # What a window's end cuts is carried into the next window whole: a secret in its
        # longest form, and in a hex dump (a line of 16 bytes takes 68 or 79 characters).
        longest = max((len(needle) for needle, _ in self.needles), default=0)
        self.overlap = _LONGEST_FORM * max(longest, BEARER_LENGTH) + 2 * 80

    def kinds_in(
        self, window: bytes, level: int = 0, opener: ViewOpener | None = None
    ) -> set[Found]:
        """The kinds in ``window``, as it is and decoded (``level``: encodings it is inside);
        ``opener``: opens what a decoded view holds when it is a container."""
        found = self._utf8(window)
        if level == 0 and b"\x00" in window:  # what UTF-16 or UTF-32 makes of ASCII has NULs
            found |= {kind for needle, kind in self.wide_needles if needle in window}
            for shape in self.wide_shapes:
                found |= self._bearers(shape, window)
        if level >= ENCODING_DEPTH:
            return found
        views = decoded_views(window)
        if views:
            # Searched together, each view on a line of its own after a NUL, which no secret,
            # no bearer's split and no stretch of encoded text goes across: a few calls for a
            # window's thousands of views (most: a path or a name that happens to be base64).
            found |= self.kinds_in(_VIEWS_APART.join(view for _, view in views), level + 1, opener)
        if opener is not None:
            for form, view in views:
                if form in _BINARY_FORMS and may_be_proven(view):
                    found |= opener(form, view, level + 1)
        return found

    def _utf8(self, data: bytes) -> set[Found]:
        found: set[Found] = {kind for needle, kind in self.needles if needle in data}
        return found | self._bearers(SPLIT_BEARER_SHAPE, data)

    def _bearers(self, shape: re.Pattern[bytes], data: bytes) -> set[Found]:
        if not self.own_bearers:  # the common case: any match is a bearer, the first will do
            return {"bearer"} if shape.search(data) else set()
        return {
            "own_bearer" if self._own(match.group()) else "bearer" for match in shape.finditer(data)
        }

    def _own(self, match: bytes) -> bool:
        # A wide or a split match, back to the bearer's ASCII.
        text = BEARER_SPLITS.sub(b"", match.replace(b"\x00", b""))
        return sha256_digest(text) in self.own_bearers

    def name(self, name: str) -> tuple[str, set[Found]]:
        """The name as the report may show it (each secret in it replaced by ``<kind>``), and
        the kinds it held: a name is kept with the run as much as a file's content."""
        raw = name.encode(errors="surrogateescape")
        kinds = self.kinds_in(raw)
        for needle, kind in self.needles:
            raw = raw.replace(needle, f"<{kind}>".encode())
        raw = SPLIT_BEARER_SHAPE.sub(b"<bearer>", raw)
        # A secret encoded is shown no more than itself: the part of a stretch up to a dot (a
        # name's extension stays) or, for a secret across a dot (a URL's escapes), the stretch.
        for run in encoded_runs(raw):
            hidden = [(part, form) for part in _DOTS.split(run) if (form := self._encoding(part))]
            if not hidden and (form := self._encoding(run)):
                hidden = [(run, form)]
            for part, form in hidden:
                raw = raw.replace(part, f"<{form}>".encode())
        return raw.decode(errors="surrogateescape"), kinds

    def _encoding(self, text: bytes) -> str | None:
        """The form in which ``text`` encodes a secret, if it does."""
        return next((form for form, view in run_views(text) if self.kinds_in(view, 1)), None)


# A layer's bytes are searched in windows of at least this much (a tar's reader reads 10 KiB at
# a time: a window each would search its overlap again and again).
_WINDOW = 256 << 10


class _Search:
    """The kinds in one stream, fed to it piece by piece: what a window's end cuts is carried
    into the next window whole. ``finish`` searches what is left."""

    def __init__(self, searcher: Searcher, level: int, opener: ViewOpener | None) -> None:
        self.searcher, self.level, self.opener = searcher, level, opener
        self.tail = b""
        self.pieces: list[bytes] = []
        self.held = 0
        self.found: set[Found] = set()

    def feed(self, data: bytes) -> None:
        self.pieces.append(data)
        self.held += len(data)
        if self.held >= _WINDOW:
            self.finish()

    def finish(self) -> None:
        if not self.held:
            return
        window = self.tail + b"".join(self.pieces)
        self.pieces, self.held = [], 0
        self.found |= self.searcher.kinds_in(window, self.level, self.opener)
        self.tail = window[-self.searcher.overlap :]

    def end(self) -> None:
        self.finish()
        self.tail = b""


class _FileVisit:
    """The layers of one file, each searched (runner.scan.layers' visitor); ``prefix`` and
    ``level``: those of a decoded view whose container it reads."""

    def __init__(
        self,
        scan: FileScan,
        file: str,
        searcher: Searcher,
        prefix: tuple[str, ...] = (),
        level: int = 0,
    ) -> None:
        self.scan, self.file, self.searcher = scan, file, searcher
        self.prefix, self.level = prefix, level
        self.searches: list[tuple[tuple[str, ...], _Search]] = []

    def layer(self, inside: tuple[str, ...]) -> _Search:
        where = (*self.prefix, *inside)

        def opener(form: str, view: bytes, level: int) -> set[Found]:
            return self.open_view((*where, form), view, level)

        search = _Search(self.searcher, self.level, opener)
        self.searches.append((where, search))
        return search

    def as_bytes(self, inside: tuple[str, ...], reason: str) -> None:
        where = (*self.prefix, *inside)
        layer = self.scan.searcher.name("!".join(where))[0] if where else None
        shown = self.scan.searcher.name(reason)[0][:200]
        self.scan.as_bytes.append(SearchedAsBytes(file=self.file, layer=layer, reason=shown))

    def open_view(self, where: tuple[str, ...], view: bytes, level: int) -> set[Found]:
        """The kinds in the container a decoded view is (base64 of a gzip), searched at the
        view's depth of encodings. A window may have cut the text that encoded it, so what
        breaks it is searched as bytes, with why."""
        seen = proven_kind(view[:HEAD])
        if seen is None:
            return set()
        inner = _FileVisit(self.scan, self.file, self.searcher, where, level)
        try:
            read_layers(io.BytesIO(view), inner, self.scan.budget)
        except READ_ERRORS as error:
            inner.as_bytes((), f"a {seen.kind} in text, read as far as it goes: {error}")
        self.searches += inner.searches
        return inner.found()

    def found(self) -> set[Found]:
        for _, search in self.searches:
            search.finish()
        return set().union(*(search.found for _, search in self.searches))


class FileScan:
    def __init__(self, base: Path, searcher: Searcher, budget: InflateBudget | None = None) -> None:
        self.base = base
        self.searcher = searcher
        self.budget = InflateBudget() if budget is None else budget  # all files' together
        self.files = 0
        self.bytes = 0
        self.leaks: list[Leak] = []
        self.canary_hits: list[str] = []
        self.own_bearers: list[str] = []  # files holding a bearer found as ``own_bearer``
        self.failures: list[ScanFailure] = []
        self.as_bytes: list[SearchedAsBytes] = []

    def name(self, path: Path) -> tuple[str, set[Found]]:
        """The path as the report shows it (relative to the base), and the kinds it held."""
        where = path.relative_to(self.base) if path.is_relative_to(self.base) else path
        return self.searcher.name(str(where))

    def note(self, file: str, kinds: set[Found], inside: str | None = None) -> None:
        for kind in sorted(kinds):
            if kind == "canary":
                self.canary_hits.append(file + (f"!{inside}" if inside else ""))
            elif kind == "own_bearer":
                self.own_bearers.append(file)
            else:
                self.leaks.append(Leak(file=file, kind=kind, inside=inside))

    def fail(self, file: str, error: str) -> None:
        shown, _ = self.searcher.name(error)  # an OS error quotes the path
        self.failures.append(ScanFailure(file=file, error=shown[:200]))

    def file(self, path: Path, searcher: Searcher | None = None) -> None:
        """Search the file (with ``searcher`` when given: another view of what is expected
        there); its name is always judged by the scan's own searcher."""
        self.files += 1
        file, in_name = self.name(path)
        self.note(file, in_name)
        visit = _FileVisit(self, file, searcher or self.searcher)
        try:
            with path.open("rb") as handle:
                self.bytes += read_layers(handle, visit, self.budget)
        except READ_ERRORS as error:
            self.fail(file, str(error))
        # What was found before a layer broke off is found all the same. Names inside a
        # container are stored as they are, so the search of its bytes has judged them; here
        # they only need hiding.
        visit.found()
        for inside, search in visit.searches:
            shown = self.searcher.name("!".join(inside))[0] if inside else None
            self.note(file, search.found, inside=shown)

    def root(self, root: Path) -> None:
        if root.is_file():
            self.file(root)
            return
        for directory, _, names in os.walk(root, onerror=self.unreadable):
            for name in sorted(names):
                path = Path(directory, name)
                if path.is_file():  # follows a symlink to a file; skips sockets, fifos
                    self.file(path)

    def unreadable(self, error: OSError) -> None:
        where = Path(error.filename) if error.filename else self.base
        self.fail(self.name(where)[0], error.strerror or "error")


@dataclass(frozen=True)
class Findings:
    """What scans made before found (the guest's disks, runner.scan.guest_disk)."""

    leaks: tuple[Leak, ...] = ()
    failures: tuple[ScanFailure, ...] = ()
    searched_as_bytes: tuple[SearchedAsBytes, ...] = ()


def scan(
    roots: Iterable[Path],
    secrets_by_kind: Mapping[SecretKind, Iterable[str]],
    base: Path,
    found_elsewhere: Findings = Findings(),
    budget: InflateBudget | None = None,
) -> ScanReport:
    """Search every file under ``roots``; paths in the report are relative to ``base``.
    ``found_elsewhere``: findings of scans made before (the guest's disks); ``budget``: what
    all the files together may inflate (None: ``MAX_INFLATED_BYTES``)."""
    searcher = Searcher(secrets_by_kind)
    run = FileScan(base, searcher, budget)
    run.leaks.extend(found_elsewhere.leaks)
    run.failures.extend(found_elsewhere.failures)
    run.as_bytes.extend(found_elsewhere.searched_as_bytes)
    present: list[Path] = []
    missing: list[Path] = []
    for root in roots:
        (present if root.exists() else missing).append(root)
        if root.exists():
            run.root(root)
    canary_planted = searcher.checked.get("canary", 0) > 0
    return ScanReport(
        scanned_at=datetime.now(UTC),
        roots_scanned=tuple(run.name(root)[0] for root in present),
        missing_roots=tuple(run.name(root)[0] for root in missing),
        files_scanned=run.files,
        bytes_scanned=run.bytes,
        secrets_checked=searcher.checked,
        leaks=tuple(run.leaks),
        canary_planted=canary_planted,
        canary_hits=tuple(run.canary_hits),
        failures=tuple(run.failures),
        clean=not run.leaks and not run.failures and (not canary_planted or bool(run.canary_hits)),
        searched_as_bytes=tuple(run.as_bytes),
    )


def scan_run(
    paths: RunPaths,
    secrets_by_kind: Mapping[SecretKind, Iterable[str]],
    extra_roots: Iterable[Path] = (),
    found_elsewhere: Findings = Findings(),
) -> ScanReport:
    """Scan the whole run directory (and any roots kept elsewhere) and write ``scan.json``;
    ``found_elsewhere`` (the guest disks' findings, runner.scan.guest_disk) is in it too."""
    roots = [paths.run_dir, *extra_roots]
    report = scan(roots, secrets_by_kind, base=paths.run_dir, found_elsewhere=found_elsewhere)
    write_model(paths.scan, report)
    return report
