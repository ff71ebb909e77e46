"""What the guest deploy is to converge to, planned on the host (deploy/guest/provision.py
converges to it): the lock's resolution checked against the store, the bundles built (harness
trees, tasks, the verifier, the runner package), the debs and wheels, the base images (built
from the lock's packages, loaded from registries, or the local one from the guest's own
userland) and each task image's build inputs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from deploy.guest import operations as guest
from deploy.guest.base_images import built_base_images
from deploy.guest.bundles import (
    harness_tree_bundle,
    pack_directory,
    runtime_bundle,
    verifier_bundle,
)
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.core.oci import read_oci_archive
from runner.core.roots import REPO_ROOT
from runner.guest.agent_plan import AgentPlan, warm_script
from runner.lab.layout import GUEST, GUEST_MIRROR_URL, GUEST_PROXY_URL
from runner.lab.task_trees import derive_tasks
from runner.spec.lock import Lock, TaskSource
from runner.spec.resolution import (
    BUILD_KINDS,
    PinnedArtifact,
    Resolution,
    load_resolution,
    resolution_path,
)
from runner.spec.task_derivation import TaskDerivation

# The local base image: the guest's own userland (a tar of its own files, no registry). /usr/bin
# and /usr/sbin are taken without their large programs (podman, ...) but with Python, git, and
# ripgrep and fd-find (rg, fdfind: OpenPI's file-search finds them on PATH, else downloads its
# own); what they and the harness scripts need from /usr/lib comes along whole. apt and dpkg come
# with their state (the guest's package database; its own sources are left out): a task's
# Dockerfile or verifier that apt-installs a package finds it installed, or fetches it from the
# lab's mirror. The harnesses and their runtimes are not in it: every task container gets them
# bound read-only (GUEST.container_mounts). With a verifier tree (lock tasks.verifier), its files
# are laid over the root (uv in /root/.local/bin, the mirror as apt's and uv's only source).
_ROOTFS_TREES = (
    "usr/lib/python3.13", "usr/lib/git-core", "usr/share/git-core", "etc/alternatives",
    "usr/lib/apt", "usr/lib/dpkg", "usr/share/dpkg", "etc/dpkg", "var/lib/dpkg",
)  # fmt: skip
_ROOTFS_ENTRIES = ("bin", "lib", "sbin", "usr", "usr/bin", "usr/sbin", "usr/lib", "usr/share")
_ROOTFS_TAIL = (
    "etc", "etc/passwd", "etc/group", "etc/ld.so.cache", "tmp", "root", "etc/apt", "var",
    "var/lib", "var/cache", "var/log",
)  # fmt: skip
# apt's own directories, as far as the guest has them (apt makes the missing ones).
_APT_DIRS = ("etc/apt", "var/lib/apt", "var/cache/apt", "var/log/apt")
# Per guest arch: its multiarch library tree and its dynamic loader (with the links to it).
_ARCH_LIBRARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "aarch64": ("usr/lib/aarch64-linux-gnu", ("usr/lib/ld-linux-aarch64.so.1",)),
    "x86_64": (
        "usr/lib/x86_64-linux-gnu",
        ("lib64", "usr/lib64", "usr/lib64/ld-linux-x86-64.so.2"),
    ),
}


def _rootfs_tar(arch: str, verifier_root: str | None) -> str:
    libraries, loader = _ARCH_LIBRARIES[arch]
    entries = (*_ROOTFS_ENTRIES, *loader, *_ROOTFS_TAIL)
    listing = [
        f"printf '%s\\n' {' '.join(entries)};",
        "find usr/bin usr/sbin ! -type d \\( -size -3M -o -name 'python3*' -o -name git "
        "-o -name rg -o -name fdfind \\);",
        f"find {' '.join((libraries, *_ROOTFS_TREES))} etc/apt/apt.conf.d;",
        f"find {' '.join(_APT_DIRS)} -type d 2>/dev/null;",
    ]
    if verifier_root:
        # tar's file list may change directory (-C): the verifier's tree is laid over the root.
        overlay = verifier_root.lstrip("/")
        listing += [
            f"echo '-C {overlay}';",
            f"(cd /{overlay} && find . -mindepth 1 | sed 's,^[.]/,,');",
        ]
    # Each path once (podman import refuses a tar with duplicates): a directory the overlay
    # shares with the root (etc, root) stays the root's.
    return (
        f"cd / && {{ {' '.join(listing)} }} | awk '!seen[$0]++' "
        "| tar -c --no-recursion --numeric-owner -T -"
    )


@dataclass(frozen=True)
class Bundle:
    """A unit the guest unpacks from the store: where to, from which blob, and the file (under
    ``dest``) whose presence shows it was unpacked."""

    unit: str
    digest: str
    dest: str
    check: str
    strip_components: int = 0

    @property
    def blob(self) -> str:
        return str(GUEST.blob(self.digest))


@dataclass(frozen=True)
class TaskImage:
    task: str
    image: str
    context: str
    digest: str  # of the task's bundle and the base image's inputs
    build_timeout_sec: float  # the task's own (task.toml), times the lock's multiplier
    # Why the lock lets this image's build fail here (tasks.needs_network); "": it must build.
    tolerated: str = ""


@dataclass(frozen=True)
class WarmCache:
    """A harness's compiled caches, warmed once in the guest (runner.guest.agent_plan)."""

    harness: str
    image: str  # the task image the warm script runs in
    script: str
    digest: str  # of the harness tree and the script; a different one warms it again

    @property
    def dest(self) -> str:
        return str(GUEST.container_artifacts.compiled_cache(self.harness))


@dataclass(frozen=True)
class RegistryBaseImage:
    """A registry base image the guest loads offline from its OCI archive in the store."""

    reference: str  # registry/repo@sha256:<manifest digest>
    digest: str  # the manifest digest the lock pins
    image_id: str  # Podman's ID once loaded: the archive's config digest
    archive: str  # the archive in the guest
    names: tuple[str, ...]  # the FROM names tagged to it


@dataclass(frozen=True)
class GuestPlan:
    debs: tuple[guest.DebFile, ...]
    runtimes: tuple[Bundle, ...]  # node, bun: unpacked for the guest itself
    container_runtimes: tuple[Bundle, ...]  # the same, unpacked again to bind into task containers
    harness_trees: tuple[Bundle, ...]
    harbor_requirement: str
    wheels: tuple[tuple[str, str], ...]
    wheels_digest: str
    runner_package: Bundle
    tasks: tuple[Bundle, ...]
    verifier: Bundle | None  # the verifier's files, laid over the local base image's root
    base_images: dict[str, tuple[str, ...]]  # local image name -> the FROM names tagged to it
    registry_images: tuple[RegistryBaseImage, ...]
    image_inputs: str
    rootfs_tar: str  # the guest's own userland for the local base images
    task_images: tuple[TaskImage, ...]
    warm_caches: tuple[WarmCache, ...]  # harnesses whose lock says compiled_cache = "warm"
    mirror: guest.Mirror  # the lab's package mirror, for the task images' builds
    debian_mirror: str  # the lock's Debian mirror: its host name is the lab's mirror in containers


def _blob(artifact: PinnedArtifact) -> str:
    return str(GUEST.blob(artifact.sha256))


def _one(resolution: Resolution, kind: str) -> PinnedArtifact:
    found = [artifact for artifact in resolution.artifacts if artifact.kind == kind]
    if len(found) != 1:
        raise RunnerError(f"resolution: expected one {kind} artifact, found {len(found)}")
    return found[0]


def warm_caches(
    lock: Lock, trees: tuple[Bundle, ...], task_images: tuple[TaskImage, ...]
) -> tuple[WarmCache, ...]:
    """What warms each harness whose lock asks for warm compiled caches: its warm script, run in
    the first task image that must build (any image that runs a cell will do: jiti's output is
    JavaScript)."""
    warm = [harness for harness in lock.harnesses if harness.compiled_cache == "warm"]
    image = next((i.image for i in task_images if not i.tolerated), task_images[0].image)
    tree_digests = {tree.unit: tree.digest for tree in trees}
    caches = []
    for harness in warm:
        script = warm_script(
            AgentPlan(
                harness=harness,
                model=lock.models[0],
                runtime_version=lock.tools.runtime_version(harness.runtime),
                artifacts_dir=str(GUEST.image_artifacts.root),
                proxy_base_url=GUEST_PROXY_URL,
            )
        )
        inputs = {"tree": tree_digests[_tree_unit(harness.id)], "script": script}
        caches.append(
            WarmCache(
                harness=harness.id,
                image=image,
                script=script,
                digest=sha256_digest(canonical_json(inputs)),
            )
        )
    return tuple(caches)


def _tree_unit(harness_id: str) -> str:
    return f"harness-{harness_id}"


def plan_guest(lock: Lock, lock_path: Path, lab: str) -> GuestPlan:
    """Check the resolution against the store, build the bundles, and say what goes where."""
    paths = CachePaths.default()
    store = ArtifactStore(paths)
    resolution = _stored_resolution(lock, lock_path, store)
    node = runtime_bundle(store, paths, _one(resolution, "node-binary"))
    bun = runtime_bundle(store, paths, _one(resolution, "bun-binary"))
    runtimes = (
        Bundle("node", node, str(GUEST.node_dir), "bin/node"),
        Bundle("bun", bun, str(GUEST.bun_dir), "bin/bun"),
    )
    trees = _harness_tree_bundles(lock, resolution, store, paths)
    # Harbor's venv takes its wheels from all of them (pip picks what harbor needs).
    wheels = tuple(
        (a.filename, _blob(a))
        for a in resolution.artifacts
        if a.kind in ("wheel", "verifier-wheel")
    )
    derived_tasks = _task_bundles(lock, resolution, store, paths)
    verifier = _verifier_tree(lock, resolution, store)
    image_inputs = _image_inputs(lock, resolution, verifier)
    registry_images = (
        *_registry_images(lock, resolution, store),
        *_built_images(lock, resolution, store, verifier),
    )
    task_images = _task_images(
        derived_tasks,
        image_inputs,
        tuple(image.digest for image in registry_images),
        tuple(a for a in resolution.artifacts if a.kind in BUILD_KINDS),
        lock.tasks,
    )
    return GuestPlan(
        debs=tuple(
            guest.DebFile(a.name, a.version, _blob(a))
            for a in resolution.artifacts
            if a.kind == "deb"
        ),
        runtimes=runtimes,
        container_runtimes=_container_runtimes(lock, node, bun),
        harness_trees=trees,
        harbor_requirement=f"harbor=={lock.tools.harbor}",
        wheels=wheels,
        wheels_digest=sha256_digest(canonical_json(sorted(wheels))),
        runner_package=_runner_package(store),
        tasks=tuple(bundle for bundle, _ in derived_tasks),
        verifier=verifier,
        base_images=_base_images(lock),
        registry_images=registry_images,
        image_inputs=image_inputs,
        rootfs_tar=_rootfs_tar(lock.guest.arch, verifier.dest if verifier else None),
        task_images=task_images,
        warm_caches=warm_caches(lock, trees, task_images),
        mirror=guest.Mirror(lab, str(resolution_path(lock_path, lock))),
        debian_mirror=lock.guest.mirror,
    )


def _stored_resolution(lock: Lock, lock_path: Path, store: ArtifactStore) -> Resolution:
    """The lock's resolution, refused unless every artifact it pins is in the store."""
    resolution = load_resolution(resolution_path(lock_path, lock), lock)
    missing = [a.filename for a in resolution.artifacts if not store.has(a.sha256)]
    if missing:
        raise RunnerError(
            f"{len(missing)} artifacts of the resolution are not in the store "
            f"(first: {missing[0]}): run 'runner resolve {lock_path}'"
        )
    return resolution


def _container_runtimes(lock: Lock, node: str, bun: str) -> tuple[Bundle, ...]:
    """The runtime bundles again, unpacked where task containers get them bound."""
    artifacts = GUEST.container_artifacts
    return (
        Bundle(
            "node-container", node, str(artifacts.runtime_dir("node", lock.tools.node)), "bin/node"
        ),
        Bundle("bun-container", bun, str(artifacts.runtime_dir("bun", lock.tools.bun)), "bin/bun"),
    )


def _harness_tree_bundles(
    lock: Lock, resolution: Resolution, store: ArtifactStore, paths: CachePaths
) -> tuple[Bundle, ...]:
    """Each harness's installed npm tree, proven unpacked by its agent's command."""
    agents = {harness.id: harness.agent for harness in lock.harnesses}
    return tuple(
        Bundle(
            _tree_unit(tree.harness),
            harness_tree_bundle(store, paths, resolution, tree),
            str(GUEST.harness_tree(tree.harness)),
            f"node_modules/.bin/{agents[tree.harness]}",
        )
        for tree in resolution.harness_trees
    )


def _task_bundles(
    lock: Lock, resolution: Resolution, store: ArtifactStore, paths: CachePaths
) -> tuple[tuple[Bundle, TaskDerivation], ...]:
    """The lock's Harbor task dirs as the lab runs them (derived by the lock's rules), packed."""
    paths.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="derived-tasks-", dir=paths.tmp) as work:
        return tuple(
            (
                Bundle(
                    f"task-{derivation.id}",
                    pack_directory(store, tree, derivation.id),
                    str(GUEST.task(derivation.id)),
                    "task.toml",
                    strip_components=1,
                ),
                derivation,
            )
            for derivation, tree in derive_tasks(lock, resolution.tasks, paths, Path(work))
        )


def _verifier_tree(lock: Lock, resolution: Resolution, store: ArtifactStore) -> Bundle | None:
    """The verifier's files for the local base image (lock tasks.verifier), or None."""
    if lock.tasks.verifier is None:
        return None
    uv = [a for a in resolution.artifacts if a.kind == "verifier-wheel" and a.name == "uv"]
    digest = verifier_bundle(store, uv[0] if uv else None, GUEST_MIRROR_URL)
    return Bundle("verifier-root", digest, str(GUEST.verifier_root), "etc/uv/uv.toml")


def _runner_package(store: ArtifactStore) -> Bundle:
    """This repository's runner package, which Harbor in the guest imports the agents from."""
    return Bundle(
        "runner-package",
        pack_directory(store, REPO_ROOT / "runner", "runner"),
        str(GUEST.python_path),
        "runner/guest/harbor_agents.py",
    )


def _base_images(lock: Lock) -> dict[str, tuple[str, ...]]:
    """Each local base image with the FROM names the tasks' Dockerfiles give it."""
    images: dict[str, list[str]] = {}
    for from_name, image in lock.tasks.local_images.items():
        images.setdefault(image, []).append(from_name)
    return {image: tuple(names) for image, names in images.items()}


def _registry_images(
    lock: Lock, resolution: Resolution, store: ArtifactStore
) -> tuple[RegistryBaseImage, ...]:
    """Each registry base image of the lock, from the archive its resolution records."""
    archives = {
        (artifact.name, artifact.version): artifact
        for artifact in resolution.artifacts
        if artifact.kind == "oci-image"
    }
    images = []
    for image in lock.tasks.registry_images:
        artifact = archives.get((image.repository, image.digest))
        if artifact is None:
            raise RunnerError(
                f"{image.reference}: not in the resolution: run 'runner resolve --update LOCK'"
            )
        loaded = read_oci_archive(store.blob(artifact.sha256))
        if loaded.manifest_digest != image.digest:
            raise RunnerError(
                f"{image.reference}: the stored archive holds manifest {loaded.manifest_digest}"
            )
        images.append(
            RegistryBaseImage(
                image.reference, image.digest, loaded.image_id, _blob(artifact), image.names
            )
        )
    return tuple(images)


def _built_images(
    lock: Lock, resolution: Resolution, store: ArtifactStore, verifier: Bundle | None
) -> tuple[RegistryBaseImage, ...]:
    """The images the project builds for FROM names (images.base), loaded as registry images
    are: from their OCI archives, each name checked to give the built manifest digest."""
    if not lock.tasks.built_images:
        return ()
    overlay = verifier.digest if verifier else verifier_bundle(store, None, GUEST_MIRROR_URL)
    return tuple(
        RegistryBaseImage(
            f"{built.record.image}@{built.record.manifest_digest}",
            built.record.manifest_digest,
            built.record.image_id,
            str(GUEST.blob(built.record.archive)),
            (*built.names, built.record.image),
        )
        for built in built_base_images(lock, resolution, store, overlay, GUEST_MIRROR_URL)
    )


def _image_inputs(lock: Lock, resolution: Resolution, verifier: Bundle | None) -> str:
    """The digest of what the local base image is made of: a change rebuilds it."""
    inputs = {
        "rootfs": _rootfs_tar(lock.guest.arch, verifier.dest if verifier else None),
        "guest": sha256_digest(canonical_json(lock.guest)),
        "debs": [deb.sha256 for deb in resolution.artifacts if deb.kind == "deb"],
    }
    if verifier is not None:
        inputs["verifier"] = verifier.digest
    return sha256_digest(canonical_json(inputs))


def _task_images(
    tasks: tuple[tuple[Bundle, TaskDerivation], ...],
    image_inputs: str,
    registry_digests: tuple[str, ...],
    recorded: tuple[PinnedArtifact, ...],
    source: TaskSource,
) -> tuple[TaskImage, ...]:
    """One image per task, rebuilt when its bundle, a base image's inputs (the local ones'
    inputs, the registry ones' digests) or what its recorded build took change; a lock without
    registry images or recorded builds keeps the digests its guests' images were labelled with.
    Each build's timeout is the lock's for it (``source``), and a task that needs the network
    may fail its build."""
    images = []
    for task, derivation in tasks:
        took = sorted(a.sha256 for a in recorded if derivation.id in a.tasks)
        inputs = [task.digest, image_inputs, *registry_digests]
        images.append(
            TaskImage(
                task=derivation.id,
                image=GUEST.task_image(derivation.id),
                context=f"{task.dest}/environment",
                digest=sha256_digest(canonical_json([*inputs, *([took] if took else [])])),
                build_timeout_sec=source.build_timeout_sec(derivation.settings.build_timeout_sec),
                tolerated=source.needs_network.get(derivation.id, ""),
            )
        )
    return tuple(images)
