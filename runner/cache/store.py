"""The content-addressed artifact store: a blob is named by the sha256 of its bytes.

Writes go to a temp file and are renamed into place, so a reader never sees half a blob; every
read hashes the blob again, so a file damaged on disk is never handed out. npm names its
tarballs by an integrity digest (usually sha512), so the store also keeps a small alias from
that digest to the sha256 blob: a warm cache is found without downloading anything.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError

_PREFIX = "sha256:"
# Strongest first: an integrity string may carry several digests; the strongest one is checked.
_INTEGRITY_ALGORITHMS = ("sha512", "sha384", "sha256", "sha1")


class CorruptArtifact(RunnerError):
    """A blob whose bytes no longer match its name, or a download that does not match."""


@dataclass(frozen=True)
class Integrity:
    """One digest of an npm integrity string (Subresource Integrity: ``<algo>-<base64>``)."""

    algorithm: str
    hex_digest: str

    @classmethod
    def parse(cls, sri: str) -> Integrity:
        digests = dict(part.split("-", 1) for part in sri.split() if "-" in part)
        for algorithm in _INTEGRITY_ALGORITHMS:
            if algorithm in digests:
                return cls(algorithm, base64.b64decode(digests[algorithm]).hex())
        raise CorruptArtifact(f"integrity {sri!r}: no digest of a known algorithm")


class ArtifactStore:
    def __init__(self, paths: CachePaths) -> None:
        self.paths = paths

    def blob(self, digest: str) -> Path:
        """The path of a blob whose bytes were just verified against its digest."""
        path = self.paths.blob(_hex(digest))
        if not path.is_file():
            raise RunnerError(f"{digest}: not in the artifact store {self.paths.artifacts}")
        actual = _file_hexdigest(path, "sha256")
        if actual != _hex(digest):
            raise CorruptArtifact(f"{path}: damaged on disk (its sha256 is now {actual})")
        return path

    def has(self, digest: str) -> bool:
        """True for a present, intact blob; a damaged one is removed so it is fetched again."""
        try:
            self.blob(digest)
        except CorruptArtifact:
            self.paths.blob(_hex(digest)).unlink()
            return False
        except RunnerError:
            return False
        return True

    def digest_for(self, integrity: Integrity) -> str | None:
        """The sha256 digest of the intact blob known by an npm integrity digest, if any."""
        alias = self.paths.integrity_alias(integrity.algorithm, integrity.hex_digest)
        if not alias.is_file():
            return None
        digest = alias.read_text().strip()
        return digest if self.has(digest) else None

    def temp_path(self, name: str) -> Path:
        """A fresh scratch path inside the store's file system (so ``os.replace`` is atomic)."""
        self.paths.tmp.mkdir(parents=True, exist_ok=True)
        return self.paths.tmp / f"{os.getpid()}-{os.urandom(6).hex()}-{name}"

    def adopt(self, temp: Path, sha256_hex: str, integrities: Iterable[Integrity] = ()) -> str:
        """Rename a verified temp file into the store and record its integrity aliases."""
        target = self.paths.blob(sha256_hex)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temp, target)
        digest = _PREFIX + sha256_hex
        for integrity in integrities:
            alias = self.paths.integrity_alias(integrity.algorithm, integrity.hex_digest)
            alias.parent.mkdir(parents=True, exist_ok=True)
            alias_temp = self.temp_path("alias")
            alias_temp.write_text(digest + "\n")
            os.replace(alias_temp, alias)
        return digest

    def add_file(self, source: Path) -> str:
        """Copy a local file into the store (hashing it once) and return its digest."""
        temp = self.temp_path(source.name)
        hasher = hashlib.sha256()
        with source.open("rb") as reader, temp.open("wb") as writer:
            while chunk := reader.read(1 << 20):
                hasher.update(chunk)
                writer.write(chunk)
        return self.adopt(temp, hasher.hexdigest())

    def add_bytes(self, data: bytes, name: str) -> str:
        temp = self.temp_path(name)
        temp.write_bytes(data)
        return self.adopt(temp, hashlib.sha256(data).hexdigest())


def _hex(digest: str) -> str:
    if not digest.startswith(_PREFIX) or len(digest) != len(_PREFIX) + 64:
        raise RunnerError(f"{digest!r}: not a 'sha256:<hex>' digest")
    return digest.removeprefix(_PREFIX)


def _file_hexdigest(path: Path, algorithm: str) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()
