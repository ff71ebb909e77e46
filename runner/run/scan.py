"""The credential scan: no real key and no bearer may survive in anything a run keeps.

After a run, every file under the retained roots (the whole run directory by default: ledger,
attempts, trials with the agents' logs and sessions, proxy counts, verify, receipt) is searched
for every real key and every bearer the proxy issued (handed over in memory, never written
down), for a planted canary, and for any string of the bearer shape (``runner.proxy.bearer``):
that catches bearers issued by an earlier runner process, which a resumed run never knew.
Compressed and archived files (gzip, bzip2, xz, zip, tar) are searched inside as well, layer
within layer to a stated depth (runner.run.containers), and file and member names too. Every
secret is searched for as UTF-8 (raw and JSON-escaped), UTF-16 and UTF-32 text (either byte
order), and inside every base64 run (either alphabet) long enough to encode one. The report
names the file and the kind of secret, never the secret: a secret in a name is shown as
``<kind>``.

A leak makes the scan unclean, and so does a file that could not be read through, and so does
a canary that was planted but not found (a scan that cannot find its canary proves nothing).
"""

from __future__ import annotations

import binascii
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from runner.core.canonical import sha256_digest
from runner.core.errors import RunnerError
from runner.core.files import write_model
from runner.core.models import FrozenModel
from runner.proxy.bearer import BEARER_LENGTH, BEARER_SHAPE, shape_in
from runner.records.paths import RunPaths
from runner.run.containers import READ_ERRORS, Feed, InflateBudget, read_layers

SecretKind = Literal["provider_key", "bearer", "canary"]
# What a search finds: a kind of secret, or a bearer of the shape known to be where it is by
# design (runner.run.guest_scan: a cell's own bearer in Podman's records), which no report
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
# A run of base64 (either alphabet, padded or not) long enough to encode the shortest secret;
# it is decoded and the decoded bytes searched as UTF-8 text.
MIN_BASE64_RUN = -(-4 * MIN_SECRET_LENGTH // 3)
_BASE64_ALPHABETS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
# Each base64 character as "A", any other byte as NUL: a run is then found by bytes.find, some
# ten times faster than a regular expression's character class over text.
_RUN_MASK = bytes(ord("A") if byte in _BASE64_ALPHABETS else 0 for byte in range(256))
_RUN_START = b"A" * MIN_BASE64_RUN
_URL_SAFE = bytes.maketrans(b"-_", b"+/")


def _base64_runs(window: bytes) -> Iterator[bytes]:
    mask = window.translate(_RUN_MASK)
    start = mask.find(_RUN_START)
    while start >= 0:
        end = mask.find(b"\x00", start)
        end = len(window) if end < 0 else end
        yield window[start:end]
        start = mask.find(_RUN_START, end)


def _decodings(run: bytes) -> Iterator[bytes]:
    """A base64 run decoded from each of its first four characters: where the encoded text
    began is not known (a run cut by the window's start, a letter before it)."""
    run = run.translate(_URL_SAFE)
    for start in range(4):
        piece = run[start:]
        piece = piece[: len(piece) - (len(piece) % 4 == 1)]  # a lone character is no byte
        yield binascii.a2b_base64(piece + b"=" * (-len(piece) % 4))


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
        # What a window's end cuts is carried into the next window whole: the longest form is
        # in UTF-32, longer than its base64 too.
        longest = max((len(needle) for needle, _ in self.wide_needles), default=0)
        self.overlap = max(longest, 4 * BEARER_LENGTH) - 1

    def kinds_in(self, window: bytes) -> set[Found]:
        found = self._utf8(window)
        if b"\x00" in window:  # what UTF-16 or UTF-32 makes of ASCII has NULs
            found |= {kind for needle, kind in self.wide_needles if needle in window}
            for shape in self.wide_shapes:
                found |= self._bearers(shape, window)
        for run in _base64_runs(window):
            for decoded in _decodings(run):
                found |= self._utf8(decoded)
        return found

    def _utf8(self, data: bytes) -> set[Found]:
        found: set[Found] = {kind for needle, kind in self.needles if needle in data}
        return found | self._bearers(BEARER_SHAPE, data)

    def _bearers(self, shape: re.Pattern[bytes], data: bytes) -> set[Found]:
        if not self.own_bearers:  # the common case: any match is a bearer, the first will do
            return {"bearer"} if shape.search(data) else set()
        return {
            "own_bearer" if self._own(match.group()) else "bearer" for match in shape.finditer(data)
        }

    def _own(self, match: bytes) -> bool:
        text = match.replace(b"\x00", b"")  # a wide encoding's match, back to ASCII
        return sha256_digest(text) in self.own_bearers

    def name(self, name: str) -> tuple[str, set[Found]]:
        """The name as the report may show it (each secret in it replaced by ``<kind>``), and
        the kinds it held: a name is kept with the run as much as a file's content."""
        raw = name.encode(errors="surrogateescape")
        kinds = self.kinds_in(raw)
        for needle, kind in self.needles:
            raw = raw.replace(needle, f"<{kind}>".encode())
        raw = BEARER_SHAPE.sub(b"<bearer>", raw)
        for run in _base64_runs(raw):  # a secret base64-encoded is shown no more than itself
            if any(self._utf8(decoded) for decoded in _decodings(run)):
                raw = raw.replace(run, b"<base64>")
        return raw.decode(errors="surrogateescape"), kinds


class _Search:
    """The kinds in one stream, fed to it piece by piece: what a piece's end cuts is carried
    into the next piece's window whole."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.tail = b""
        self.found: set[Found] = set()

    def feed(self, data: bytes) -> None:
        if data:
            window = self.tail + data
            self.found |= self.searcher.kinds_in(window)
            self.tail = window[-self.searcher.overlap :]


class FileScan:
    def __init__(self, base: Path, searcher: Searcher, budget: InflateBudget | None = None) -> None:
        self.base = base
        self.searcher = searcher
        self.budget = budget  # shared by every file; None: each file its own
        self.files = 0
        self.bytes = 0
        self.leaks: list[Leak] = []
        self.canary_hits: list[str] = []
        self.own_bearers: list[str] = []  # files holding a bearer found as ``own_bearer``
        self.failures: list[ScanFailure] = []

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
        searches: list[tuple[tuple[str, ...], _Search]] = []

        def visit(inside: tuple[str, ...]) -> Feed:
            searches.append((inside, _Search(searcher or self.searcher)))
            return searches[-1][1].feed

        try:
            with path.open("rb") as handle:
                self.bytes += read_layers(handle, visit, self.budget)
        except READ_ERRORS as error:
            self.fail(file, str(error))
        # What was found before a layer broke off is found all the same. Names inside a
        # container are stored as they are, so the search of its bytes has judged them; here
        # they only need hiding.
        for inside, search in searches:
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


def scan(
    roots: Iterable[Path],
    secrets_by_kind: Mapping[SecretKind, Iterable[str]],
    base: Path,
    found_elsewhere: tuple[tuple[Leak, ...], tuple[ScanFailure, ...]] = ((), ()),
    budget: InflateBudget | None = None,
) -> ScanReport:
    """Search every file under ``roots``; paths in the report are relative to ``base``.
    ``found_elsewhere``: leaks and failures of scans made before (the guest's disks);
    ``budget``: what all the files together may inflate (None: each file its own cap)."""
    searcher = Searcher(secrets_by_kind)
    run = FileScan(base, searcher, budget)
    run.leaks.extend(found_elsewhere[0])
    run.failures.extend(found_elsewhere[1])
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
    )


def scan_run(
    paths: RunPaths,
    secrets_by_kind: Mapping[SecretKind, Iterable[str]],
    extra_roots: Iterable[Path] = (),
    found_elsewhere: tuple[tuple[Leak, ...], tuple[ScanFailure, ...]] = ((), ()),
) -> ScanReport:
    """Scan the whole run directory (and any roots kept elsewhere) and write ``scan.json``;
    ``found_elsewhere`` (the guest disks' findings, runner.run.guest_scan) is in it too."""
    roots = [paths.run_dir, *extra_roots]
    report = scan(roots, secrets_by_kind, base=paths.run_dir, found_elsewhere=found_elsewhere)
    write_model(paths.scan, report)
    return report
