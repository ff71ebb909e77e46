"""The resolution: what was found for a lock, every artifact the guest needs with its digest.

The lock says what was asked; the resolution (``<lock dir>/<lock name>.resolved.json``,
canonical JSON) says what the sources had: each artifact's kind, name, version, source URL,
file name and ``sha256:`` digest, the resolver tools' versions and the fingerprint of the lock it
was resolved for. Two resolutions are the same when their content is: ``runner resolve --check``
compares a fresh one with the file and refuses on any difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.core.models import FrozenModel, Sha256, Slug
from runner.spec.lock import Lock

ArtifactKind = Literal["deb", "wheel", "npm", "node-binary", "bun-binary"]


class PinnedArtifact(FrozenModel):
    """One file the guest installs, as fetched from its source and kept in the artifact store."""

    kind: ArtifactKind
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    url: str = Field(min_length=1)
    filename: str = Field(min_length=1)
    sha256: Sha256
    size: int = Field(ge=0)
    integrity: str | None = Field(default=None, description="npm dist.integrity (SRI)")
    harnesses: tuple[Slug, ...] = Field(
        default=(), description="npm: the harnesses whose dependency tree holds this package"
    )

    @property
    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.name, self.version, self.filename)


# Where a tree's pinned tarballs sit, relative to the tree's directory: the lockfile names them
# as ``file:tarballs/<file>`` (artifacts.npm writes it, deploy's bundles put the files there).
TARBALLS_DIR = "tarballs"


class HarnessTree(FrozenModel):
    """A harness's npm tree (package + extensions), frozen as npm's package-lock.json.

    The lockfile itself is a blob in the artifact store; the packages it installs on the guest's
    platform are the ``npm`` artifacts that name this harness.
    """

    harness: Slug
    sources: tuple[str, ...] = Field(min_length=1)
    lockfile: Sha256


class ResolverTools(FrozenModel):
    """Versions of the host tools that chose the artifacts (a new resolver may choose others)."""

    apt: str
    npm: str
    pip: str


class Resolution(FrozenModel):
    schema_version: Literal[1] = 1
    lock_name: Slug
    # Artifacts depend only on what the guest is made of, not on models, repeats or deadline.
    environment_fingerprint: Sha256
    arch: Literal["aarch64", "x86_64"]
    suite: Slug
    tools: ResolverTools
    artifacts: tuple[PinnedArtifact, ...]
    harness_trees: tuple[HarnessTree, ...]

    @property
    def digest(self) -> str:
        return sha256_digest(canonical_json(self))

    def artifact_difference(self, other: Resolution) -> str | None:
        """One line naming the first difference from ``other`` (None when they are equal)."""
        if self == other:
            return None
        for field in ("environment_fingerprint", "arch", "suite", "tools"):
            mine, theirs = getattr(self, field), getattr(other, field)
            if mine != theirs:
                return f"{field}: recorded {_short(mine)}, found {_short(theirs)}"
        recorded = {_identity(artifact): artifact for artifact in self.artifacts}
        found = {_identity(artifact): artifact for artifact in other.artifacts}
        for identity in sorted(recorded.keys() - found.keys()):
            return f"{identity}: recorded, but the sources no longer give it"
        for identity in sorted(found.keys() - recorded.keys()):
            return f"{identity}: found, but not recorded"
        for identity in sorted(recorded):
            if recorded[identity] != found[identity]:
                return (
                    f"{identity}: recorded {recorded[identity].sha256}, "
                    f"found {found[identity].sha256}"
                )
        return "harness_trees: the npm lockfiles differ"


def _identity(artifact: PinnedArtifact) -> str:
    return f"{artifact.kind}:{artifact.name}@{artifact.version} ({artifact.filename})"


def _short(value: object) -> str:
    return canonical_json(value).decode() if isinstance(value, FrozenModel) else str(value)


def resolution_path(lock_path: Path, lock: Lock) -> Path:
    """The resolution lives beside its lock, named after the lock."""
    return lock_path.parent / f"{lock.name}.resolved.json"


def load_resolution(path: Path, lock: Lock) -> Resolution:
    """Read a resolution and refuse one that was resolved for another lock."""
    resolution = read_model(path, Resolution)
    if resolution.environment_fingerprint != lock.environment_fingerprint:
        raise RunnerError(
            f"{path}: resolved for environment {resolution.environment_fingerprint}, but the "
            f"lock's is now {lock.environment_fingerprint}: run 'runner resolve' again"
        )
    return resolution
