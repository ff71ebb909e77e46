"""npm: pinned packages checked against the registry, dependency trees frozen by npm itself.

Each tree (the tools Node and Bun, and each harness's package with its extensions) is resolved by
``npm install --package-lock-only`` for the guest's os/cpu/libc. npm records every platform's
optional packages in the lockfile but silently leaves out one the registry does not have, so
after npm the tree is checked: every optional package named for the guest must be in it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from runner.artifacts.fetch import Wanted
from runner.artifacts.git import Packed, pin_mismatches
from runner.artifacts.http import get_json
from runner.artifacts.plan import Plan, Planned, PlannedTree
from runner.artifacts.tools import run_tool
from runner.artifacts.versions import nearest_version
from runner.cache.store import ArtifactStore
from runner.spec.lock import PinnedPackage
from runner.spec.platform import GuestPlatform, platform_of
from runner.spec.resolution import TARBALLS_DIR, ArtifactKind

# The abbreviated document npm itself asks for: versions with dist and dependencies only.
_PACKUMENT = "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8"
_NODE_MINIMUM = (22, 19)  # Pi 0.84 refuses older Node (seen: "needs Node >= 22.19")


@dataclass(frozen=True)
class NpmTree:
    """A set of npm specs installed together; ``harness`` is None for the tools tree."""

    harness: str | None
    packages: tuple[PinnedPackage, ...]


class NpmRegistry:
    """The registry npm is configured with, asked through one HTTP session (answers memoised)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url.rstrip("/") + "/"
        self._packuments: dict[str, Any | None] = {}

    async def packument(self, name: str) -> Any | None:
        if name not in self._packuments:
            url = self.url + quote(name, safe="@")
            self._packuments[name] = await get_json(self.session, url, _PACKUMENT)
        return self._packuments[name]

    async def why_unavailable(self, name: str, version: str) -> str | None:
        """None when the registry has ``name@version``, else what to write after the name."""
        packument = await self.packument(name)
        if packument is None:
            return "not on the npm registry (no package of that name)"
        versions = packument.get("versions", {})
        if version in versions:
            return None
        nearest = nearest_version(version, versions)
        return "not on the npm registry" + (f"; nearest: {nearest}" if nearest else "")


def bun_tree(bun: str) -> NpmTree:
    """Bun's npm package: its optional packages carry the prebuilt binary for each platform."""
    return NpmTree(None, (PinnedPackage(source=f"npm:bun@{bun}"),))


async def node_pin_problem(node: str, registry: NpmRegistry, platform: GuestPlatform) -> list[str]:
    problem = node_too_old(node) or await registry.why_unavailable(platform.node_package, node)
    return [] if problem is None else [f"npm:{platform.node_package}@{node}: {problem}"]


async def plan_node(node: str, registry: NpmRegistry, platform: GuestPlatform) -> Plan:
    """Node's prebuilt binary for the guest, as an npm package of its own (no dependencies).

    Asked for by name, not through npm's tree: npm refuses a package for another CPU as a
    direct dependency, whatever ``--cpu`` says.
    """
    packument = await registry.packument(platform.node_package)
    assert packument is not None  # node_pin_problem found the version in it
    dist = packument["versions"][node]["dist"]
    url: str = dist["tarball"]
    wanted = Wanted(url, url.rsplit("/", 1)[-1], integrity=dist["integrity"])
    return Plan(planned=[Planned("node-binary", platform.node_package, node, wanted)])


def node_too_old(node: str) -> str | None:
    numbers = tuple(int(part) for part in node.split(".")[:2] if part.isdigit())
    if numbers >= _NODE_MINIMUM:
        return None
    return f"the Pi harness needs Node >= {'.'.join(map(str, _NODE_MINIMUM))} (tools.node)"


async def tree_pin_problems(
    tree: NpmTree, registry: NpmRegistry, store: ArtifactStore, paths_root: Path
) -> list[str]:
    """One line per package of the tree its source does not have (asks only for metadata)."""
    problems = []
    for package in tree.packages:
        problem = await _pin_problem(package, registry, store, paths_root)
        if problem is not None:
            problems.append(f"{package.source}: {problem}")
    return problems


@dataclass(frozen=True)
class PinnedTarball:
    """A tarball the lock pins (``file:``, or packed from ``git+``): where npm's spec points
    (``file:tarballs/<file name>``, the same on every machine) and where the bytes are."""

    package: PinnedPackage
    spec: str
    file: Path
    wanted: Wanted


def pinned_tarballs(
    tree: NpmTree, paths_root: Path, packed: Mapping[str, Packed], store: ArtifactStore
) -> list[PinnedTarball]:
    found = []
    for package in tree.packages:
        if package.source.startswith("file:"):
            file = paths_root / package.source.removeprefix("file:")
            wanted = Wanted(package.source, file.name, sha256=package.sha256)
        elif package.source in packed:
            record = packed[package.source].record
            file = store.blob(record.sha256)
            wanted = Wanted(package.source, record.filename, sha256=record.sha256)
        else:
            continue
        found.append(PinnedTarball(package, f"file:{TARBALLS_DIR}/{wanted.filename}", file, wanted))
    return found


async def plan_tree(
    tree: NpmTree,
    registry: NpmRegistry,
    platform: GuestPlatform,
    paths_root: Path,
    store: ArtifactStore,
    packed: Mapping[str, Packed],
    kept: bytes | None = None,
) -> Plan:
    """The tree's packages for the guest; its pins were checked by ``tree_pin_problems``. A git
    package's dependencies are held at its own lockfile's versions (runner.artifacts.git).
    ``kept``: the tree's lockfile from an earlier resolution, which npm starts from: it moves
    only what the packages' new pins need moved."""
    plan = Plan()
    pinned = pinned_tarballs(tree, paths_root, packed, store)
    by_source = {tarball.package.source: tarball.spec for tarball in pinned}
    specs = [by_source.get(package.source) or _install_spec(package) for package in tree.packages]
    ours = [packed[p.source] for p in tree.packages if p.source in packed]
    overrides = {item.record.name: item.overrides for item in ours if item.overrides}
    lockfile_bytes = await _npm_lockfile(
        specs, pinned, overrides, platform, tree.harness or "tools", kept
    )
    lockfile = json.loads(lockfile_bytes)
    for parent, missing, spec in missing_platform_packages(lockfile, platform):
        problem = await _platform_package_problem(registry, missing, spec)
        plan.unavailable.append(
            f"npm:{missing}@{spec}: {problem} ({parent} needs it on "
            f"{platform.npm_os}-{platform.npm_cpu}; npm skipped it silently)"
        )
    plan.unavailable.extend(misnamed_tarballs(lockfile, pinned))
    for item in ours:
        plan.unavailable.extend(pin_mismatches(lockfile, item))
    tarballs = {tarball.spec: tarball.wanted for tarball in pinned}
    plan.planned.extend(_planned_packages(lockfile, tree.harness, platform, tarballs))
    if tree.harness is not None:
        sources = tuple(package.source for package in tree.packages)
        plan.trees.append(PlannedTree(tree.harness, sources, lockfile_bytes, overrides))
    return plan


async def _pin_problem(
    package: PinnedPackage, registry: NpmRegistry, store: ArtifactStore, paths_root: Path
) -> str | None:
    if package.npm_name is not None and package.version is not None:
        return await registry.why_unavailable(package.npm_name, package.version)
    if package.source.startswith("git+"):
        return None  # fetched and packed before any check (runner.artifacts.git)
    tarball = paths_root / package.source.removeprefix("file:")
    if not tarball.is_file():
        return f"no such file {tarball}"
    assert package.sha256 is not None  # the lock requires it for 'file:'
    digest = store.add_file(tarball)
    if digest != package.sha256:
        return f"its sha256 is {digest}, the lock says {package.sha256}"
    return None


def misnamed_tarballs(lockfile: dict[str, Any], pinned: list[PinnedTarball]) -> list[str]:
    """A pinned tarball whose lock ``name`` is not the name npm installed it under."""
    installed = {
        entry.get("resolved"): path.removeprefix("node_modules/")
        for path, entry in lockfile.get("packages", {}).items()
        if path.startswith("node_modules/")
    }
    return [
        f"{tarball.package.source}: its package.json names it "
        f"{installed.get(tarball.spec, '(nothing)')!r}, the lock says {tarball.package.name!r}"
        for tarball in pinned
        if tarball.package.name is not None and installed.get(tarball.spec) != tarball.package.name
    ]


def _install_spec(package: PinnedPackage) -> str:
    if package.npm_name is not None:
        return f"{package.npm_name}@{package.version}"
    return package.source


async def _npm_lockfile(
    specs: list[str],
    tarballs: list[PinnedTarball],
    overrides: dict[str, dict[str, Any]],
    platform: GuestPlatform,
    label: str,
    kept: bytes | None = None,
) -> bytes:
    """npm's lockfile for ``specs``; ``tarballs`` are copied to where their specs point, and
    ``overrides`` (package -> name -> version) hold versions inside a package's subtree;
    ``kept`` is the lockfile npm starts from."""
    with tempfile.TemporaryDirectory(prefix=f"npm-tree-{label}-") as workdir:
        directory = Path(workdir)
        package_json: dict[str, Any] = {"name": label, "private": True}
        if overrides:
            package_json["overrides"] = overrides
        (directory / "package.json").write_text(json.dumps(package_json))
        if kept is not None:
            (directory / "package-lock.json").write_bytes(kept)
        for tarball in tarballs:
            target = directory / tarball.spec.removeprefix("file:")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tarball.file, target)
        await run_tool(
            [
                "npm", "install", "--package-lock-only", "--save-exact", "--ignore-scripts",
                "--no-audit", "--no-fund", "--omit-lockfile-registry-resolved=false",
                f"--os={platform.npm_os}", f"--cpu={platform.npm_cpu}",
                f"--libc={platform.npm_libc}", *specs,
            ],
            f"npm tree of {label}",
            cwd=directory,
        )  # fmt: skip
        return (directory / "package-lock.json").read_bytes()


def _entries(lockfile: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """Installed packages of a lockfile (v2/v3): (name, entry), the root project left out."""
    for key, entry in lockfile.get("packages", {}).items():
        if key and not entry.get("link"):
            yield entry.get("name") or key.rsplit("node_modules/", 1)[-1], entry


def _installs_on(entry: dict[str, Any], platform: GuestPlatform) -> bool:
    return platform.accepts(entry.get("os", []), entry.get("cpu", []), entry.get("libc", []))


def _needed_on(name: str, entry: dict[str, Any], platform: GuestPlatform) -> bool:
    """npm's rule, and an optional package whose name says another platform is left out too:
    many musl or Android builds declare only os and cpu (``@oven/bun-linux-aarch64-musl``)."""
    if entry.get("optional") and platform_of(name) is not None and not platform.named_in(name):
        return False
    return _installs_on(entry, platform)


def missing_platform_packages(
    lockfile: dict[str, Any], platform: GuestPlatform
) -> list[tuple[str, str, str]]:
    """(parent@version, missing package, its spec) for each optional package built for the
    guest that a package installed on the guest lists but npm left out of the tree."""
    names = {name for name, _ in _entries(lockfile)}
    root = lockfile.get("packages", {}).get("", {})
    parents = [(root.get("name", "(root)"), root), *_entries(lockfile)]
    missing = []
    for parent, entry in parents:
        if not _installs_on(entry, platform):
            continue
        for name, spec in sorted(entry.get("optionalDependencies", {}).items()):
            if platform.named_in(name) and name not in names:
                missing.append((f"{parent}@{entry.get('version', '')}".rstrip("@"), name, spec))
    return missing


async def _platform_package_problem(registry: NpmRegistry, name: str, spec: str) -> str:
    if await registry.packument(name) is None:
        return "not on the npm registry"
    problem = await registry.why_unavailable(name, spec)
    return problem or "on the npm registry, but npm left it out of the tree"


def _kind(name: str, platform: GuestPlatform) -> ArtifactKind:
    return "bun-binary" if name == platform.bun_package else "npm"


def packages_for_guest(
    lockfile: dict[str, Any], platform: GuestPlatform
) -> Iterable[tuple[str, dict[str, Any]]]:
    """The lockfile's packages npm installs on the guest, bundled ones left out (they arrive
    inside their parent's tarball)."""
    for name, entry in _entries(lockfile):
        if not entry.get("inBundle") and _needed_on(name, entry, platform):
            yield name, entry


def _planned_packages(
    lockfile: dict[str, Any],
    harness: str | None,
    platform: GuestPlatform,
    tarballs: dict[str, Wanted],
) -> Iterable[Planned]:
    harnesses = (harness,) if harness is not None else ()
    for name, entry in packages_for_guest(lockfile, platform):
        resolved: str = entry["resolved"]
        if resolved.startswith("file:"):
            # A tarball pinned in the lock: already in the store, named by the lock's source.
            wanted = tarballs[resolved]
        else:
            wanted = Wanted(resolved, resolved.rsplit("/", 1)[-1], integrity=entry["integrity"])
        yield Planned(_kind(name, platform), name, entry["version"], wanted, harnesses)
