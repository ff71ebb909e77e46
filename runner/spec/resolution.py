"""The resolution: what was found for a lock, every artifact the guest needs with its digest.

The lock says what was asked; the resolution (``<lock dir>/<lock name>.resolved.json``,
canonical JSON) says what the sources had: each artifact's kind, name, version, source URL,
file name and ``sha256:`` digest, the resolver tools' versions and the digest of the lock's
environment inputs it was resolved for (``lock_environment``). A committed resolution is
authoritative: ``runner resolve`` fetches exactly what it records and never re-resolves; only
``runner resolve --update`` asks the sources again.

The environment fingerprint is what the guest is made of: the lock's environment inputs and
every artifact the resolution gives the guest (kind, name, version, sha256) and each harness
tree's lockfile digest. A new transitive dependency is a new fingerprint, so a lab deployed or
frozen for the old one is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.core.models import FrozenModel, Sha256, Slug
from runner.spec.lock import Lock, load_lock

# "verifier-wheel": a wheel the tasks' verifiers install (lock tasks.verifier), served by the lab's
# package mirror; "wheel": Harbor's venv in the guest. "oci-image": a registry base image as an
# OCI archive (runner.artifacts.oci); its name is the repository, its version the manifest digest.
# build-deb, build-python: what a task's image build took from the lab's mirror beyond the
# rest, recorded from the build itself (runner.artifacts.recording); never installed in the guest.
# build-debian-file: a file of the Debian archive a build asked for by its own path on the
# lock's Debian mirror (a suite's signed index from a sources line the Dockerfile adds, a source
# package's files for `apt-get source`); its name is that path. trial-*: what a task's trial
# took beyond all that at run time (its reference solution and its verifier), recorded from its
# oracle; served to its cells the same way.
ArtifactKind = Literal[
    "deb", "wheel", "verifier-wheel", "npm", "node-binary", "bun-binary", "oci-image",
    "build-deb", "build-python", "build-debian-file", "trial-deb", "trial-python",
    "trial-debian-file", "base-deb",
]  # fmt: skip
BUILD_KINDS: tuple[ArtifactKind, ...] = ("build-deb", "build-python", "build-debian-file")
TRIAL_KINDS: tuple[ArtifactKind, ...] = ("trial-deb", "trial-python", "trial-debian-file")
# Files of the Debian archive served by their path on the lock's Debian mirror.
DEBIAN_FILE_KINDS: tuple[ArtifactKind, ...] = ("build-debian-file", "trial-debian-file")
# Every kind recorded from a task in a lab (runner resolve LOCK --lab LAB).
RECORDED_KINDS: tuple[ArtifactKind, ...] = (*BUILD_KINDS, *TRIAL_KINDS)


class PinnedArtifact(FrozenModel):
    """One file the guest installs, as fetched from its source and kept in the artifact store."""

    LATE_FIELDS = frozenset({"suite", "tasks", "images"})

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
    suite: Slug | None = Field(default=None, description="deb: the suite it was taken from")
    tasks: tuple[Slug, ...] = Field(
        default=(), description="build-*, trial-*: the tasks whose build or trial took this file"
    )
    images: tuple[str, ...] = Field(
        default=(), description="base-deb: the built base images (images.base) made of it"
    )

    @property
    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.name, self.version, self.filename)

    @property
    def is_pinned_tarball(self) -> bool:
        """A tarball the lock pins (``file:``, or packed from ``git+``), not a registry file."""
        return self.url.startswith(("file:", "git+"))


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
    # npm ``overrides`` the tree was resolved with (a git package's own lockfile versions,
    # runner.artifacts.git): npm checks the lockfile against them, so they install with it.
    overrides: dict[str, Any] = Field(default_factory=dict)

    def package_json(self, lockfile: dict[str, Any]) -> dict[str, Any]:
        """The package.json that npm installs the frozen ``lockfile`` with."""
        root = lockfile["packages"][""]
        package = {"name": root["name"], "private": True, "dependencies": root["dependencies"]}
        return {**package, "overrides": self.overrides} if self.overrides else package


class GitPackage(FrozenModel):
    """A ``git+URL#COMMIT`` package as packed on the host (runner.artifacts.git): the tarball
    every later ``runner resolve`` must pack again byte for byte, and the own lockfile whose
    versions its dependencies were installed at."""

    source: str = Field(pattern=r"^git\+\S+#[0-9a-f]{40}$")
    tag: str | None = None
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    filename: str = Field(min_length=1)
    sha256: Sha256
    packed_with: str = Field(min_length=1, description="the packing tool and its version")
    own_lockfile: str | None = Field(description="bun.lock, package-lock.json, ...; None: none")
    own_lockfile_sha256: Sha256 | None
    pins_digest: Sha256 = Field(description="the name -> versions its own lockfile pins")


class ResolvedTask(FrozenModel):
    """A task of a git task source: the commit it was fetched at and its tree's digest
    (runner.spec.task_derivation.tree_digest, Terminal-Bench's own), which every later fetch must
    give."""

    id: Slug
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: Sha256


class ResolverTools(FrozenModel):
    """Versions of the host tools that chose the artifacts (a new resolver may choose others)."""

    LATE_FIELDS = frozenset({"skopeo"})

    apt: str
    npm: str
    pip: str
    # Only for a lock with registry base images: the tool that pulled them (its layout files are
    # in the archive whose sha256 is recorded).
    skopeo: str | None = None


class _FingerprintInputs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lock_environment: Sha256
    artifacts: tuple[PinnedArtifact, ...]
    harness_trees: tuple[HarnessTree, ...]
    tasks: tuple[ResolvedTask, ...] = ()


class Resolution(FrozenModel):
    schema_version: Literal[2] = 2
    lock_name: Slug
    # Artifacts depend only on what the guest is made of, not on models, repeats or deadline:
    # the lock's environment inputs (Lock.environment_inputs) it was resolved for.
    lock_environment: Sha256
    # Written for people and diffs; computed when omitted, and a file's must match its content.
    environment_fingerprint: Sha256
    arch: Literal["aarch64", "x86_64"]
    suite: Slug
    tools: ResolverTools
    artifacts: tuple[PinnedArtifact, ...]
    harness_trees: tuple[HarnessTree, ...]
    git_packages: tuple[GitPackage, ...] = ()
    tasks: tuple[ResolvedTask, ...] = ()

    LATE_FIELDS = frozenset({"tasks"})

    @model_validator(mode="before")
    @classmethod
    def _fingerprint_of_content(cls, data: Any) -> Any:
        """Computed when a model is built without it; a file's must be what its content gives."""
        if not isinstance(data, dict):
            return data
        content = _FingerprintInputs.model_validate(data)
        computed = environment_fingerprint(
            content.lock_environment, content.artifacts, content.harness_trees, content.tasks
        )
        stated = data.get("environment_fingerprint", computed)
        if stated != computed:
            raise ValueError(
                f"environment_fingerprint {stated} is not the one its artifacts give ({computed})"
            )
        return {**data, "environment_fingerprint": computed}

    @property
    def digest(self) -> str:
        return sha256_digest(canonical_json(self))

    def artifact_difference(self, other: Resolution) -> str | None:
        """One line naming the first difference from ``other`` (None when they are equal)."""
        if self == other:
            return None
        for field in ("lock_environment", "arch", "suite", "tools"):
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


def environment_fingerprint(
    lock_environment: str,
    artifacts: tuple[PinnedArtifact, ...],
    harness_trees: tuple[HarnessTree, ...],
    tasks: tuple[ResolvedTask, ...] = (),
) -> str:
    """What the guest is made of: the lock's environment inputs and every resolved artifact
    (kind, name, version, sha256: Debian packages, wheels, npm tarballs and runtimes alike),
    harness lockfile and git task tree. Where a file was fetched from does not change what is
    installed. (Tasks enter only when there are some: a resolution from before git task sources
    keeps its fingerprint.)"""
    content: dict[str, object] = {
        "lock_environment": lock_environment,
        "artifacts": sorted(
            (artifact.kind, artifact.name, artifact.version, artifact.sha256)
            for artifact in artifacts
        ),
        "harness_trees": sorted((tree.harness, tree.lockfile) for tree in harness_trees),
    }
    if tasks:
        content["tasks"] = sorted((task.id, task.commit, task.tree) for task in tasks)
    return sha256_digest(canonical_json(content))


class RecordedContent(BaseModel):
    """What ``runner resolve --update`` compares, read from a resolution file of any schema
    version (an older format is replaced, but its packages still say what changed)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    environment_fingerprint: str = "(none)"
    artifacts: tuple[PinnedArtifact, ...] = ()
    harness_trees: tuple[HarnessTree, ...] = ()
    tasks: tuple[ResolvedTask, ...] = ()


def changes(old: RecordedContent | Resolution | None, new: Resolution) -> list[str]:
    """What ``new`` changes from ``old``, package by package: ``added``/``removed`` lines and
    ``name old -> new``; a harness tree whose lockfile changed; empty when nothing did."""
    before = _versions(old.artifacts if old else ())
    after = _versions(new.artifacts)
    lines = []
    for package in sorted(before.keys() | after.keys()):
        was, now = before.get(package, {}), after.get(package, {})
        if not was:
            lines.append(f"added {package} {_listed(now)}")
        elif not now:
            lines.append(f"removed {package} {_listed(was)}")
        elif was.keys() != now.keys():
            lines.append(f"{package} {_listed(was)} -> {_listed(now)}")
        elif was != now:
            lines.append(
                f"{package} {_listed(was)}: sha256 {_listed(was, True)} -> {_listed(now, True)}"
            )
    old_trees = {tree.harness: tree.lockfile for tree in (old.harness_trees if old else ())}
    for tree in new.harness_trees:
        if old_trees.get(tree.harness) != tree.lockfile:
            lines.append(f"harness tree {tree.harness}: lockfile {tree.lockfile}")
    lines.extend(
        f"removed harness tree {harness}"
        for harness in sorted(old_trees.keys() - {tree.harness for tree in new.harness_trees})
    )
    old_tasks = {task.id: task for task in (old.tasks if old else ())}
    lines.extend(
        f"task {task.id}: commit {task.commit}, tree {task.tree}"
        for task in new.tasks
        if old_tasks.get(task.id) != task
    )
    return lines


def _versions(artifacts: tuple[PinnedArtifact, ...]) -> dict[str, dict[str, str]]:
    """``kind:name`` -> version -> sha256 (npm may hold several versions of one package)."""
    found: dict[str, dict[str, str]] = {}
    for artifact in artifacts:
        found.setdefault(f"{artifact.kind}:{artifact.name}", {})[artifact.version] = artifact.sha256
    return found


def _listed(versions: dict[str, str], digests: bool = False) -> str:
    return ", ".join(versions[v] if digests else v for v in sorted(versions))


def _identity(artifact: PinnedArtifact) -> str:
    return f"{artifact.kind}:{artifact.name}@{artifact.version} ({artifact.filename})"


def _short(value: object) -> str:
    return canonical_json(value).decode() if isinstance(value, FrozenModel) else str(value)


def resolution_path(lock_path: Path, lock: Lock) -> Path:
    """The resolution lives beside its lock, named after the lock."""
    return lock_path.parent / f"{lock.name}.resolved.json"


def lockfiles_dir(resolution_file: Path) -> Path:
    """The harness trees' npm lockfiles, committed beside the resolution that names their
    digests (``demo.resolved.json`` -> ``demo.lockfiles/<harness>.package-lock.json``): a fresh
    clone installs the same trees without asking npm again."""
    return resolution_file.with_name(
        resolution_file.name.removesuffix(".resolved.json") + ".lockfiles"
    )


def lockfile_path(resolution_file: Path, harness: str) -> Path:
    return lockfiles_dir(resolution_file) / f"{harness}.package-lock.json"


def load_resolution(path: Path, lock: Lock, lock_path: Path | None = None) -> Resolution:
    """Read a resolution and refuse one that does not cover the lock's environment."""
    if not path.is_file():
        raise RunnerError(
            f"{path}: no resolution for lock {lock.name}: run 'runner resolve --update "
            f"{lock_path or 'LOCK'}'"
        )
    resolution = read_model(path, Resolution)
    if resolution.lock_environment != lock.environment_inputs:
        raise RunnerError(
            f"{path}: resolved for lock environment {resolution.lock_environment}, but the "
            f"lock's is now {lock.environment_inputs}: run 'runner resolve --update "
            f"{lock_path or 'LOCK'}'"
        )
    return resolution


def load_resolved_lock(lock_path: Path, resolution_file: Path | None = None) -> Lock:
    """The lock with its environment fingerprint, from its resolution (beside it by default)."""
    lock = load_lock(lock_path)
    path = resolution_file or resolution_path(lock_path, lock)
    resolution = load_resolution(path, lock, lock_path)
    return lock.with_environment(resolution.environment_fingerprint)
