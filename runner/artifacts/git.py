"""``git+URL#COMMIT`` harness packages: fetched at exactly that commit, packed reproducibly, and
installed with the versions of the package's OWN lockfile, never by its semver ranges.

The host fetches the one commit (and the tag the lock names beside it, which must point at it)
into an empty repository, writes the commit's tree with fixed modes (0644, or 0755 for an
executable; whatever the umask) and packs it with ``npm pack --ignore-scripts`` (npm fixes the
mtimes). The tarball goes to the artifact store by its sha256 and is installed like a pinned
``file:`` tarball. Its own lockfile (``bun.lock``, ``npm-shrinkwrap.json`` or
``package-lock.json``) gives the exact versions of its production dependencies: each name with one
version there is pinned for the package's subtree by an npm ``overrides`` entry, and the tree npm
writes is checked, package by package, against the lockfile's versions (``pin_mismatches``).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.artifacts.tools import ToolFailed, run_tool, tool_version
from runner.cache.store import ArtifactStore
from runner.core.archives import extract
from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.spec.lock import PinnedPackage
from runner.spec.resolution import GitPackage

# The lockfiles a package may ship, in the order they are believed (npm's own order first).
OWN_LOCKFILES = ("npm-shrinkwrap.json", "package-lock.json", "bun.lock")
# bun.lock is JSON with trailing commas: drop a comma before } or ], never one inside a string.
_TRAILING_COMMA = re.compile(r'("(?:\\.|[^"\\])*")|,(\s*[}\]])')


@dataclass(frozen=True)
class Locked:
    """One package of an own lockfile, at its npm-style path (``node_modules/a/node_modules/b``;
    bun.lock's ``a/b`` becomes that), with what it depends on."""

    name: str
    version: str
    dependencies: tuple[str, ...]
    optional: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()  # required peers (npm installs them), optional ones left out

    def installs(self, path: str) -> tuple[str, ...]:
        """What npm installs for it. The package's own peers (Pi and its typebox) are the
        harness's to give; a dependency's required peers npm installs, so they are pinned too."""
        return (*self.dependencies, *self.optional, *(self.peers if path else ()))


# path -> package; "" is the package itself (its own dependencies)
OwnTree = Mapping[str, Locked]


@dataclass(frozen=True)
class Packed:
    """A git package packed into the store, and the tree its own lockfile pins."""

    package: PinnedPackage
    record: GitPackage
    own: OwnTree

    @property
    def pinned(self) -> list[tuple[str, Locked]]:
        """The production dependencies as its own lockfile has them: (parent name, package)."""
        return [(self.own[parent].name, locked) for parent, locked in _walk_own(self.own)]

    @property
    def overrides(self) -> dict[str, Any]:
        """npm ``overrides`` for the package's subtree: a name its lockfile has at one version is
        held at it everywhere below the package; a name it has at several, under each parent
        (npm's nested form, the parent itself kept by ``"."``)."""
        versions: dict[str, set[str]] = {}
        for _, locked in self.pinned:
            versions.setdefault(locked.name, set()).add(locked.version)
        overrides: dict[str, Any] = {}
        for parent, locked in self.pinned:
            if len(versions[locked.name]) == 1:
                overrides.setdefault(locked.name, locked.version)
            elif parent != self.record.name and len(versions.get(parent, ())) == 1:
                nested = overrides.get(parent)
                if not isinstance(nested, dict):
                    nested = overrides[parent] = {".": next(iter(versions[parent]))}
                nested[locked.name] = locked.version
        return dict(sorted(overrides.items()))


class GitSourceError(RunnerError):
    """A git source that cannot be frozen: one line naming URL and commit."""


async def pack_git(package: PinnedPackage, store: ArtifactStore) -> Packed:
    url, commit = package.git_url, package.git_commit
    assert url is not None and commit is not None  # a git+ source, by the lock's pattern
    with tempfile.TemporaryDirectory(prefix="git-package-") as workdir:
        work = Path(workdir)
        repo, tree, out = work / "repo", work / "tree", work / "out"
        for directory in (repo, tree, out):
            directory.mkdir()
        await git(repo, "init", "--quiet")
        await fetch_commit(repo, url, commit, package.source)
        if package.tag is not None:
            await _check_tag(repo, url, commit, package.tag, package.source)
        archive = await git_bytes(repo, "archive", "--format=tar", commit)
        _extract_fixed_modes(archive, tree)
        npm = await tool_version(["npm", "--version"], "npm --version")
        answer = await run_tool(
            ["npm", "pack", "--json", "--ignore-scripts", "--pack-destination", str(out)],
            f"{package.source}: npm pack",
            cwd=tree,
        )
        packed = json.loads(answer)[0]
        tarball = out / packed["filename"]
        digest = store.add_file(tarball)
        own_lockfile, own = own_lockfile_pins(tree)
        record = GitPackage(
            source=package.source,
            tag=package.tag,
            name=packed["name"],
            version=packed["version"],
            filename=packed["filename"],
            sha256=digest,
            packed_with=f"npm {npm}",
            own_lockfile=own_lockfile,
            own_lockfile_sha256=(
                sha256_digest((tree / own_lockfile).read_bytes()) if own_lockfile else None
            ),
            pins_digest=_pins_digest(own),
        )
    return Packed(package, record, own)


def _pins_digest(own: OwnTree) -> str:
    pinned = sorted((parent, locked.name, locked.version) for parent, locked in _walk_own(own))
    return sha256_digest(canonical_json(pinned))


async def fetch_commit(repo: Path, url: str, commit: str, source: str) -> None:
    try:
        await run_tool(
            ["git", "-C", str(repo), "fetch", "--quiet", "--depth", "1", url, commit],
            f"git fetch {url}",
        )
    except ToolFailed as error:
        raise GitSourceError(
            f"{source}: the remote {url} does not have commit {commit} ({error})"
        ) from None


async def _check_tag(repo: Path, url: str, commit: str, tag: str, source: str) -> None:
    try:
        await git(repo, "fetch", "--quiet", "--depth", "1", url, f"refs/tags/{tag}")
    except ToolFailed:
        raise GitSourceError(f"{source}: the remote {url} has no tag {tag}") from None
    tagged = (await git(repo, "rev-parse", "FETCH_HEAD^{commit}")).strip()
    if tagged != commit:
        raise GitSourceError(
            f"{source}: tag {tag} of {url} points at {tagged}, the lock says {commit}"
        )


async def git(repo: Path, *args: str) -> str:
    return await run_tool(["git", "-C", str(repo), *args], f"git {args[0]}")


async def git_bytes(repo: Path, *args: str) -> bytes:
    process = await asyncio.create_subprocess_exec(
        "git", "-C", str(repo), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await process.communicate()
    if process.returncode != 0:
        raise ToolFailed(f"git {args[0]}", stderr.decode(errors="replace"))
    return stdout


def _extract_fixed_modes(archive: bytes, target: Path) -> None:
    """The commit's tree with modes 0755/0644 whatever the umask (npm pack keeps mode bits)."""

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        extract(tar, target, fixed_modes=True)


def own_lockfile_pins(tree: Path) -> tuple[str | None, dict[str, Locked]]:
    """The package's own lockfile and the tree it records (no lockfile: an empty tree, and the
    dependencies are resolved once and frozen like any other npm tree)."""
    for name in OWN_LOCKFILES:
        path = tree / name
        if path.is_file():
            text = path.read_text()
            own = _bun_tree(text) if name == "bun.lock" else _npm_tree(json.loads(text))
            return name, own
    return None, {}


def _npm_tree(lockfile: dict[str, Any]) -> dict[str, Locked]:
    own = {}
    for path, entry in lockfile.get("packages", {}).items():
        if entry.get("link"):
            continue
        name = entry.get("name") or path.rsplit("node_modules/", 1)[-1]
        own[path] = _locked(name, entry.get("version", ""), entry)
    return own


def _bun_tree(text: str) -> dict[str, Locked]:
    lock = json.loads(_TRAILING_COMMA.sub(lambda m: m.group(1) or m.group(2), text))
    root = lock.get("workspaces", {}).get("", {})
    own = {"": _locked(root.get("name", ""), "", root)}
    for key, entry in lock.get("packages", {}).items():
        name, _, version = entry[0].rpartition("@")
        meta = next((item for item in entry[1:] if isinstance(item, dict)), {})
        own[_bun_path(key)] = _locked(name, version, meta)
    return own


def _bun_path(key: str) -> str:
    """bun.lock's ``a/@types/node`` -> ``node_modules/a/node_modules/@types/node``."""
    names: list[str] = []
    for part in key.split("/"):
        if names and names[-1].startswith("@") and "/" not in names[-1]:
            names[-1] += "/" + part
        else:
            names.append(part)
    return "/".join(f"node_modules/{name}" for name in names)


def _locked(name: str, version: str, entry: Mapping[str, Any]) -> Locked:
    optional_peers = set(entry.get("optionalPeers", ())) | {
        peer for peer, meta in entry.get("peerDependenciesMeta", {}).items() if meta.get("optional")
    }
    return Locked(
        name,
        version,
        tuple(entry.get("dependencies", {})),
        tuple(entry.get("optionalDependencies", {})),
        tuple(peer for peer in entry.get("peerDependencies", {}) if peer not in optional_peers),
    )


def _walk_own(own: OwnTree) -> Iterable[tuple[str, Locked]]:
    """(parent path, package) for every package reachable from the root, each path once."""
    seen: set[str] = set()
    todo = [""] if own else []
    while todo:
        at = todo.pop()
        for dependency in own[at].installs(at):
            path = _located(own, at, dependency)
            if path is not None and path not in seen:
                seen.add(path)
                yield at, own[path]
                todo.append(path)


def pin_mismatches(lockfile: dict[str, Any], packed: Packed) -> list[str]:
    """One line per package under ``packed`` in npm's tree whose version is not the one its own
    lockfile has at the same place (empty when every one is its lockfile's)."""
    if not packed.own:
        return []
    packages: dict[str, Any] = lockfile.get("packages", {})
    todo = [("", f"node_modules/{packed.record.name}")]
    seen: set[str] = set()
    lines = []
    while todo:
        own_at, npm_at = todo.pop()
        parent = packed.own[own_at]
        for dependency in parent.installs(own_at):
            own_path = _located(packed.own, own_at, dependency)
            npm_path = _located(packages, npm_at, dependency)
            if npm_path is None or npm_path in seen:
                continue  # an optional package for another platform, or already checked
            seen.add(npm_path)
            version = packages[npm_path].get("version")
            wanted = packed.own[own_path].version if own_path is not None else "(nothing)"
            if version != wanted:
                lines.append(
                    f"{packed.package.source}: npm installed {dependency}@{version} for "
                    f"{parent.name or packed.record.name}, its {packed.record.own_lockfile} "
                    f"has {wanted}"
                )
            elif own_path is not None:
                todo.append((own_path, npm_path))
    return lines


def _located(packages: Mapping[str, Any], at: str, name: str) -> str | None:
    """Where Node finds ``name`` from the package at ``at`` (nearest node_modules upwards)."""
    base = at
    while True:
        candidate = f"{base}/node_modules/{name}" if base else f"node_modules/{name}"
        if candidate in packages:
            return candidate
        if not base:
            return None
        base = base.rpartition("/node_modules/")[0] if "/node_modules/" in base else ""
