"""Resolving a lock: every section asks its source, then everything is fetched into the store.

Nothing is fetched while any pinned artifact is unavailable: all sections report first, and a
lock that asks for something its sources do not have fails closed with one line per artifact,
before any VM is touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from runner.artifacts.debian import plan_base_image_debs, plan_debs
from runner.artifacts.fetch import Fetched, FetchReport, fetch_all
from runner.artifacts.git import Packed, pack_git
from runner.artifacts.http import new_session
from runner.artifacts.npm import (
    NpmRegistry,
    NpmTree,
    bun_tree,
    node_pin_problem,
    plan_node,
    plan_tree,
    tree_pin_problems,
)
from runner.artifacts.oci import image_problems, pull_image, skopeo_version
from runner.artifacts.plan import Plan, Planned
from runner.artifacts.task_source import fetch_tasks
from runner.artifacts.tools import PIP, run_tool, tool_version
from runner.artifacts.wheels import harbor_pin_problem, plan_wheels
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.errors import RunnerError
from runner.spec.lock import Lock
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import (
    ArtifactKind,
    GitPackage,
    HarnessTree,
    PinnedArtifact,
    Resolution,
    ResolvedTask,
    ResolverTools,
    environment_fingerprint,
)

Section = Literal["debs", "wheels", "tools", "harnesses", "tasks", "images"]
ALL_SECTIONS: frozenset[Section] = frozenset(
    ("debs", "wheels", "tools", "harnesses", "tasks", "images")
)


class UnavailableArtifacts(RunnerError):
    """The lock pins something its sources do not have: one line per artifact, exit code 1."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class KeptPins:
    """What an earlier resolution pinned, for an update to start from (``runner resolve
    --update``): each harness tree's lockfile, and each wheel's ``name==version`` by kind."""

    lockfiles: Mapping[str, bytes] = field(default_factory=dict)
    wheels: Mapping[ArtifactKind, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, artifacts: Iterable[PinnedArtifact], lockfiles: Mapping[str, bytes]) -> KeptPins:
        wheels: dict[ArtifactKind, list[str]] = {}
        for artifact in artifacts:
            if artifact.kind in ("wheel", "verifier-wheel"):
                wheels.setdefault(artifact.kind, []).append(f"{artifact.name}=={artifact.version}")
        return cls(lockfiles, {kind: tuple(pins) for kind, pins in wheels.items()})


@dataclass(frozen=True)
class Resolved:
    resolution: Resolution
    report: FetchReport

    @property
    def total_bytes(self) -> int:
        return sum(artifact.size for artifact in self.resolution.artifacts)


async def resolve_lock(
    lock: Lock,
    paths_root: Path,
    paths: CachePaths,
    console: Console,
    sections: frozenset[Section] = ALL_SECTIONS,
    kept: KeptPins | None = None,
) -> Resolved:
    """Resolve ``sections`` of the lock for its guest; a partial resolution is for tests only.
    ``kept``: start from an earlier resolution's pins, moving only what the lock now needs
    moved (else every pin is chosen afresh)."""
    kept = kept or KeptPins()
    platform = GuestPlatform(lock.guest.arch)
    store = ArtifactStore(paths)
    trees = _npm_trees(lock, sections)
    images = lock.tasks.registry_images if "images" in sections else ()
    async with new_session() as session:
        npm_registry = await run_tool(["npm", "config", "get", "registry"], "npm config")
        registry = NpmRegistry(session, npm_registry.strip())
        # Metadata first: a pin its source lacks fails in seconds, before any slow step.
        checks = [tree_pin_problems(tree, registry, store, paths_root) for tree in trees]
        if "tools" in sections:
            checks.append(node_pin_problem(lock.tools.node, registry, platform))
        if "wheels" in sections:
            checks.append(harbor_pin_problem(session, lock.tools.harbor, lock.tools.python_index))
        checks.append(image_problems(images, platform))
        # The git sources too (tasks, git harness packages): each absent commit is one line,
        # beside the registries' lines.
        fetched = await _fetched_tasks(lock, paths, sections)
        packed, unpacked = await _pack_git_packages(trees, store)
        for item in packed.values():
            console.print(
                f"{item.package.source}: packed {item.record.name} {item.record.version} "
                f"({item.record.sha256})",
                soft_wrap=True,
            )
        await _fail_on_problems(
            checks, [*([fetched] if isinstance(fetched, str) else []), *unpacked]
        )
        tasks = () if isinstance(fetched, str) else fetched
        steps = [
            plan_tree(tree, registry, platform, paths_root, store, packed,
                      kept.lockfiles.get(tree.harness) if tree.harness else None)
            for tree in trees
        ]  # fmt: skip
        if "tools" in sections:
            steps.append(plan_node(lock.tools.node, registry, platform))
        if sections & {"debs", "wheels"}:
            steps.append(_plan_debs_and_wheels(lock, platform, paths, sections, kept))
        plan = Plan()
        for section_plan in await asyncio.gather(*steps):
            plan.merge(section_plan)
    if plan.unavailable:
        raise UnavailableArtifacts(plan.unavailable)
    # A package in several trees is one file: fetch it once.
    wanted = {planned.wanted.url: planned.wanted for planned in plan.planned}
    report = await fetch_all(store, list(wanted.values()), console)
    pulled = await asyncio.gather(*(pull_image(image, platform, store) for image in images))
    for image in pulled:
        report.fetched[image.url] = Fetched(image.sha256, image.size)
        report.downloaded_files += 1
        report.downloaded_bytes += image.size
    artifacts = tuple(
        sorted((*_artifacts(plan.planned, report), *pulled), key=lambda item: item.sort_key)
    )
    harness_trees = _stored_trees(plan, store)
    resolution = Resolution(
        lock_name=lock.name,
        lock_environment=lock.environment_inputs,
        environment_fingerprint=environment_fingerprint(
            lock.environment_inputs, artifacts, harness_trees, tasks
        ),
        arch=lock.guest.arch,
        suite=lock.guest.suite,
        tools=await _resolver_tools(with_skopeo=bool(images)),
        artifacts=artifacts,
        harness_trees=harness_trees,
        git_packages=tuple(sorted((item.record for item in packed.values()), key=_by_source)),
        tasks=tasks,
    )
    return Resolved(resolution, report)


async def _fetched_tasks(
    lock: Lock, paths: CachePaths, sections: frozenset[Section]
) -> tuple[ResolvedTask, ...] | str:
    """The git task source's trees, or the one line saying why it cannot be fetched."""
    if "tasks" not in sections:
        return ()
    try:
        return await fetch_tasks(lock.tasks, paths)
    except RunnerError as error:
        return str(error)


async def _fail_on_problems(checks: list[Coroutine[Any, Any, list[str]]], found: list[str]) -> None:
    """Run the metadata checks together; every line any of them found (after ``found``, the
    problems already known), or nothing."""
    problems = [*found, *(line for lines in await asyncio.gather(*checks) for line in lines)]
    if problems:
        raise UnavailableArtifacts(problems)


def _stored_trees(plan: Plan, store: ArtifactStore) -> tuple[HarnessTree, ...]:
    """Each planned harness tree, its package-lock.json added to the store."""
    return tuple(
        HarnessTree(
            harness=tree.harness,
            sources=tree.sources,
            lockfile=store.add_bytes(tree.lockfile, f"{tree.harness}-package-lock.json"),
            overrides=tree.overrides,
        )
        for tree in plan.trees
    )


async def _pack_git_packages(
    trees: list[NpmTree], store: ArtifactStore
) -> tuple[dict[str, Packed], list[str]]:
    """Every ``git+`` package of the trees, fetched at its commit and packed (once each), and a
    line for each one that cannot be."""
    sources = {p.source: p for tree in trees for p in tree.packages if p.git_commit is not None}
    results = await asyncio.gather(
        *(pack_git(package, store) for package in sources.values()), return_exceptions=True
    )
    failures = [str(result) for result in results if isinstance(result, RunnerError)]
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, RunnerError):
            raise result
    return {item.package.source: item for item in results if isinstance(item, Packed)}, failures


def _by_source(record: GitPackage) -> str:
    return record.source


def _npm_trees(lock: Lock, sections: frozenset[Section]) -> list[NpmTree]:
    trees = [bun_tree(lock.tools.bun)] if "tools" in sections else []
    if "harnesses" in sections:
        trees.extend(
            NpmTree(harness.id, (harness.package, *harness.extensions))
            for harness in lock.harnesses
        )
    return trees


async def _plan_debs_and_wheels(
    lock: Lock, platform: GuestPlatform, paths: CachePaths, sections: frozenset[Section],
    kept: KeptPins,
) -> Plan:  # fmt: skip
    """Debian first: the suite's glibc says which manylinux wheels run on the guest."""
    verifier = lock.tasks.verifier
    task_debs = verifier.debs if verifier else ()
    debian = await plan_debs(lock.guest, lock.tools, platform, paths, task_debs)
    if debian.plan.unavailable:  # a pinned tool no suite has: nothing to choose wheels for
        return debian.plan
    plan = debian.plan if "debs" in sections else Plan()
    if "debs" in sections and (recipes := tuple(r for r, _ in lock.tasks.built_images)):
        plan.merge(await plan_base_image_debs(recipes, lock.guest, platform, paths, task_debs))
    if "wheels" in sections:
        index, glibc = lock.tools.python_index, debian.glibc_minor
        harbor = (f"harbor=={lock.tools.harbor}",)
        plan.merge(
            await plan_wheels(harbor, index, platform, glibc, "wheel", kept.wheels.get("wheel", ()))
        )
        if verifier and verifier.requirements:
            requirements = verifier.requirements
            pins = kept.wheels.get("verifier-wheel", ())
            plan.merge(
                await plan_wheels(requirements, index, platform, glibc, "verifier-wheel", pins)
            )
    return plan


def _artifacts(planned: list[Planned], report: FetchReport) -> tuple[PinnedArtifact, ...]:
    """One artifact per file, naming every harness whose tree holds it."""
    by_url: dict[str, PinnedArtifact] = {}
    for item in planned:
        fetched = report.fetched[item.wanted.url]
        known = by_url.get(item.wanted.url)
        harnesses = set(item.harnesses) | set(known.harnesses if known else ())
        images = set(item.images) | set(known.images if known else ())
        by_url[item.wanted.url] = PinnedArtifact(
            # A wheel both Harbor and the verifiers need keeps the kind it was first planned
            # with (Harbor's); the lab's mirror serves every wheel of the resolution.
            kind=known.kind if known else item.kind,
            name=item.name,
            version=item.version,
            url=item.wanted.url,
            filename=item.wanted.filename,
            sha256=fetched.digest,
            size=fetched.size,
            integrity=item.wanted.integrity,
            harnesses=tuple(sorted(harnesses)),
            suite=item.suite,
            images=tuple(sorted(images)),
        )
    return tuple(sorted(by_url.values(), key=lambda artifact: artifact.sort_key))


async def _resolver_tools(with_skopeo: bool) -> ResolverTools:
    apt, npm, pip = await asyncio.gather(
        tool_version(["apt-get", "--version"], "apt-get --version"),
        tool_version(["npm", "--version"], "npm --version"),
        tool_version([*PIP, "--version"], "pip --version"),
    )
    # "pip 26.3 from /path/to/site-packages (python 3.11)": the path differs between machines.
    # skopeo only for a lock that has registry images: the others' records stay as they were.
    skopeo = await skopeo_version() if with_skopeo else None
    return ResolverTools(apt=apt, npm=npm, pip=" ".join(pip.split()[:2]), skopeo=skopeo)
