"""The guest deploy: everything a cell needs, installed offline from the host's artifact store.

``plan_guest`` runs on the host while pyinfra prepares: it checks the lock's resolution against
the store and builds the bundles (harness trees, tasks, the runner package); ``guest_provisioning``
is the pyinfra deploy that converges the guest to that plan, reading every artifact from the
store through the read-only 9p share (runner/lab/layout.py draws the guest's layout).
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.deploy import deploy
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

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
from runner.guest import warm_harbor
from runner.guest.task_images import TaskImageBuild
from runner.lab import egress
from runner.lab.layout import AGENT_USER, ARTIFACTS_MOUNT_TAG, DOCKER_HOST, GUEST, GUEST_MIRROR_URL
from runner.lab.task_trees import derive_tasks
from runner.spec.lock import Lock
from runner.spec.resolution import (
    BUILD_KINDS,
    PinnedArtifact,
    Resolution,
    load_resolution,
    resolution_path,
)
from runner.spec.task_derivation import TaskDerivation

# Mount options exactly as /proc/self/mountinfo shows them (pyinfra's server.mount compares
# them); fstab has the same. msize: 512000 is virtio-9p's largest. cache=0xf is cache=loose as the
# kernel writes it: the guest caches and reads ahead, which is safe because a blob of the store
# never changes (its name is its digest). Measured under TCG on a loaded host: 9-14 MB/s without
# the cache, 40-90 MB/s with it; 1.5-1.9 MB/s with the default msize.
# Debian's podman-docker makes `docker compose` run `podman compose`, which only starts the
# compose provider, Docker Compose, with Podman's socket as its Docker host and BuildKit off:
# under TCG that Podman start is ~3 s of each of Harbor's dozen compose calls a cell. This
# `docker` (first on PATH) starts Docker Compose itself, so set; the rest goes to Podman.
DOCKER_COMMAND = f"""#!/bin/sh
if [ "$1" = compose ]; then
  shift
  export DOCKER_HOST="${{DOCKER_HOST:-{DOCKER_HOST}}}" DOCKER_BUILDKIT=0
  exec /usr/libexec/docker/cli-plugins/docker-compose "$@"
fi
exec /usr/bin/podman "$@"
"""
MOUNT_OPTIONS = ("ro", "trans=virtio", "msize=512000", "cache=0xf")
FSTAB_OPTIONS = ",".join((*MOUNT_OPTIONS, "nofail"))

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
    build_timeout_sec: float  # the task's own (task.toml)


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
    mirror: guest.Mirror  # the lab's package mirror, for the task images' builds
    debian_mirror: str  # the lock's Debian mirror: its host name is the lab's mirror in containers


def _blob(artifact: PinnedArtifact) -> str:
    return str(GUEST.blob(artifact.sha256))


def _one(resolution: Resolution, kind: str) -> PinnedArtifact:
    found = [artifact for artifact in resolution.artifacts if artifact.kind == kind]
    if len(found) != 1:
        raise RunnerError(f"resolution: expected one {kind} artifact, found {len(found)}")
    return found[0]


def refuse_warm_compiled_caches(lock: Lock) -> None:
    """A harness whose lock asks for warm compiled caches cannot be provisioned yet: the guest
    would be frozen cold while the lock says warm (the receipt would then fail closed)."""
    warm = [harness.id for harness in lock.harnesses if harness.compiled_cache == "warm"]
    if warm:
        raise RunnerError(
            f"harness {', '.join(warm)}: compiled_cache = 'warm' is not provisioned yet (this "
            "deploy does not warm jiti's cache); give 'cold', the default"
        )


def plan_guest(lock: Lock, lock_path: Path, lab: str) -> GuestPlan:
    """Check the resolution against the store, build the bundles, and say what goes where."""
    refuse_warm_compiled_caches(lock)
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
        task_images=_task_images(
            derived_tasks,
            image_inputs,
            tuple(image.digest for image in registry_images),
            tuple(a for a in resolution.artifacts if a.kind in BUILD_KINDS),
        ),
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
            f"harness-{tree.harness}",
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
    registry_digests: tuple[str, ...] = (),
    recorded: tuple[PinnedArtifact, ...] = (),
) -> tuple[TaskImage, ...]:
    """One image per task, rebuilt when its bundle, a base image's inputs (the local ones'
    inputs, the registry ones' digests) or what its recorded build took change; a lock without
    registry images or recorded builds keeps the digests its guests' images were labelled with."""
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
                build_timeout_sec=derivation.settings.build_timeout_sec,
            )
        )
    return tuple(images)


def _unpacked(name: str, bundle: Bundle) -> None:
    guest.unpacked(
        name=name,
        unit=bundle.unit,
        blob=bundle.blob,
        dest=bundle.dest,
        digest=bundle.digest,
        strip_components=bundle.strip_components,
        check=bundle.check,
    )


@deploy("Guest provisioning")
def guest_provisioning(plan: GuestPlan) -> None:
    # The steps are plain functions, not nested deploys: a nested deploy would put its own name
    # before its operations' names, and the idempotence checks compare those names.
    _artifact_store_mounted()
    guest.debs_installed(name="Debian packages of the resolution", debs=plan.debs)
    _egress_refused_and_recorded()
    _podman_served(plan.debian_mirror)
    server.user(
        name=f"Unprivileged agent user {AGENT_USER}",
        user=AGENT_USER,
        shell="/bin/bash",
        create_home=True,
    )
    for runtime in (*plan.runtimes, *plan.container_runtimes):
        _unpacked(f"{runtime.unit} in {runtime.dest}", runtime)
    for tree in plan.harness_trees:
        _unpacked(f"Harness tree {tree.dest}", tree)
    _harbor_installed(plan)
    for task in plan.tasks:
        _unpacked(f"Task {task.dest}", task)
    if plan.verifier is not None:
        _unpacked(f"Verifier files for the base image in {plan.verifier.dest}", plan.verifier)
    files.directory(name="Harbor trial dirs", path=str(GUEST.trials_dir))
    _images_built(plan)


def _artifact_store_mounted() -> None:
    """The host's artifact store, read-only over 9p, now and at every boot."""
    mount = str(GUEST.artifacts_mount)
    files.directory(name="Mount point of the artifact store", path=mount)
    files.line(
        name="Artifact store in fstab (read-only 9p)",
        path="/etc/fstab",
        line=f"^{ARTIFACTS_MOUNT_TAG} ",
        replace=f"{ARTIFACTS_MOUNT_TAG} {mount} 9p {FSTAB_OPTIONS} 0 0",
    )
    server.mount(
        name="Artifact store mounted (read-only 9p)",
        path=mount,
        device=ARTIFACTS_MOUNT_TAG,
        fs_type="9p",
        options=list(MOUNT_OPTIONS),
    )


def _egress_refused_and_recorded() -> None:
    """The egress firewall (runner/lab/egress.py), loaded now and at every boot, and the guest's
    resolver that it refuses and records (the task containers' is Podman's config)."""
    ruleset = files.put(
        name="Egress firewall ruleset (nftables)",
        src=io.StringIO(egress.ruleset()),
        dest=egress.RULESET_PATH,
        mode="755",
    )
    systemd.service(
        name="Egress firewall loaded at every boot (nftables.service)",
        service="nftables.service",
        running=True,
        enabled=True,
    )
    # Reload, never restart: the unit's stop is `nft flush ruleset`, which would also remove
    # Podman's (netavark's) table; its reload loads the file, which replaces this table only.
    systemd.service(
        name="Egress firewall reloaded (ruleset changed)",
        service="nftables.service",
        reloaded=True,
        _if=ruleset.did_change,
    )
    files.put(
        name="The guest's resolver: a loopback sink the firewall records",
        src=io.StringIO(egress.RESOLV_CONF),
        dest="/etc/resolv.conf",
    )


def _podman_served(debian_mirror: str) -> None:
    """Podman's Docker-compatible socket, configured for a guest without D-Bus, for Harbor."""
    files.file(name="Podman's docker command without its notice", path="/etc/containers/nodocker")
    hosts = files.put(
        name="Task containers' base hosts file: the Debian mirror's name is the lab's mirror",
        src=io.StringIO(egress.container_hosts(debian_mirror)),
        dest=egress.CONTAINER_HOSTS_PATH,
    )
    podman_config = files.put(
        name="Podman manages cgroups itself (no D-Bus in the guest for systemd's manager); "
        "its containers' resolver is a sink the egress firewall records",
        src=io.StringIO(egress.CONTAINERS_DNS_CONF + '[engine]\ncgroup_manager = "cgroupfs"\n'),
        dest="/etc/containers/containers.conf.d/50-bench.conf",
    )
    # Kept running (the package's unit exits after 5 s idle, and each cell would start it again
    # several times, ~2 s each under TCG, whenever the agent is quiet): started before the
    # freeze with the warm Harbor process (its unit wants it), so it is in the saved guest.
    never_idle = files.put(
        name="Podman's API service never exits idle",
        src=io.StringIO(
            "[Service]\nExecStart=\nExecStart=/usr/bin/podman $LOGGING system service --time=0\n"
        ),
        dest="/etc/systemd/system/podman.service.d/50-bench.conf",
    )
    systemd.daemon_reload(name="systemd reads the drop-in", _if=never_idle.did_change)
    # The API service reads containers.conf and its unit when it starts: one started before them
    # (the package's socket activates it on first use) would keep the systemd manager ("crun:
    # cannot open sd-bus" at every container start) or its idle exit, so a change stops it.
    systemd.service(
        name="Podman's API service restarted on its next connection (config changed)",
        service="podman.service",
        running=False,
        _if=any_changed(podman_config, never_idle, hosts),
    )
    systemd.service(
        name="Podman's Docker-compatible socket for Harbor",
        service="podman.socket",
        running=True,
        enabled=True,
    )
    files.put(
        name="Harbor's docker command: compose straight to Docker Compose, the rest to Podman",
        src=io.StringIO(DOCKER_COMMAND),
        dest="/usr/local/bin/docker",
        mode="755",
    )


def _harbor_installed(plan: GuestPlan) -> None:
    """Harbor's venv from the stored wheels, with the runner package (the agents) on its path."""
    guest.harbor_venv(
        name=f"Harbor ({plan.harbor_requirement}) in {GUEST.harbor_venv}",
        venv=str(GUEST.harbor_venv),
        requirement=plan.harbor_requirement,
        wheels=plan.wheels,
        digest=plan.wheels_digest,
    )
    _unpacked(f"The runner package in {plan.runner_package.dest}", plan.runner_package)
    files.put(
        name="The runner package on the Harbor venv's path",
        src=io.StringIO(f"{GUEST.python_path}\n"),
        dest=str(GUEST.site_packages / "bench-runner.pth"),
    )
    unit = files.put(
        name=f"The warm Harbor process's unit ({warm_harbor.UNIT})",
        src=io.StringIO(_warm_harbor_unit()),
        dest=f"/etc/systemd/system/{warm_harbor.UNIT}",
    )
    systemd.daemon_reload(name="systemd reads the warm Harbor unit", _if=unit.did_change)
    # Started here so a guest is never without it; `runner freeze` restarts it right before
    # the guest is saved, so the frozen one has served nothing.
    systemd.service(
        name="The warm Harbor process waiting for a cell",
        service=warm_harbor.UNIT,
        running=True,
    )
    systemd.service(
        name="The warm Harbor process restarted (its unit changed)",
        service=warm_harbor.UNIT,
        restarted=True,
        _if=unit.did_change,
    )


def _warm_harbor_unit() -> str:
    """Harbor's venv Python on runner/guest/warm_harbor.py. It serves one cell and ends (no
    restart: the next cell's reset brings it back waiting); HOME as a root SSH session's."""
    return (
        "[Unit]\n"
        "Description=A warm Harbor process for the next cell (runner/guest/warm_harbor.py)\n"
        "Wants=podman.service\n"
        "After=podman.service\n\n"
        "[Service]\n"
        f"ExecStart={GUEST.harbor_venv}/bin/python -m runner.guest.warm_harbor\n"
        "Environment=HOME=/root\n"
        "WorkingDirectory=/root\n"
        "Restart=no\n"
    )


def _images_built(plan: GuestPlan) -> None:
    """The registry base images loaded from the store and the local ones made from the guest's
    own userland, then every task's image on them."""
    for registry in plan.registry_images:
        guest.registry_image(
            name=f"Registry base image {registry.reference} (as {', '.join(registry.names)})",
            archive=registry.archive,
            digest=registry.digest,
            image_id=registry.image_id,
            names=registry.names,
        )
    for image, aliases in plan.base_images.items():
        guest.base_image(
            name=f"Local base image {image} (as {', '.join(aliases)})",
            image=image,
            aliases=aliases,
            digest=plan.image_inputs,
            rootfs_tar=plan.rootfs_tar,
        )
    for task_image in plan.task_images:
        guest.task_image(
            name=f"Task image {task_image.image}",
            task=task_image.task,
            image=task_image.image,
            context=task_image.context,
            digest=task_image.digest,
            timeout_seconds=task_image.build_timeout_sec,
            mirror=plan.mirror,
        )
    guest.task_images_built(
        name="Every task image built",
        images=tuple(
            TaskImageBuild(
                task=image.task,
                image=image.image,
                inputs_digest=image.digest,
                build_timeout_sec=image.build_timeout_sec,
            )
            for image in plan.task_images
        ),
    )
