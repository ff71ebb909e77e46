"""The guest deploy: everything a cell needs, installed offline from the host's artifact store.

``deploy.guest.plan.plan_guest`` runs on the host while pyinfra prepares: it checks the lock's
resolution against the store and builds the bundles (harness trees, tasks, the runner package);
``guest_provisioning`` is the pyinfra deploy that converges the guest to that plan, reading
every artifact from the store through the read-only 9p share (runner/lab/layout.py draws the
guest's layout).
"""

from __future__ import annotations

import io

from pyinfra.api.deploy import deploy
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from deploy.guest import operations as guest
from deploy.guest.plan import Bundle, GuestPlan
from runner.guest import warm_harbor
from runner.guest.task_images import TaskImageBuild
from runner.lab import egress
from runner.lab.layout import AGENT_USER, ARTIFACTS_MOUNT_TAG, DOCKER_HOST, GUEST

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
    _compiled_caches_warmed(plan)


def _compiled_caches_warmed(plan: GuestPlan) -> None:
    """The compiled-cache dir every task container binds (empty unless a harness is warm), and
    each warm harness's cache made in it, after the task images it runs in are built."""
    files.directory(
        name="Compiled caches of warm harnesses",
        path=str(GUEST.container_artifacts.compiled_caches),
    )
    for cache in plan.warm_caches:
        guest.compiled_cache_warmed(
            name=f"Compiled caches of {cache.harness} warmed in {cache.dest}",
            harness=cache.harness,
            image=cache.image,
            script=cache.script,
            dest=cache.dest,
            digest=cache.digest,
        )


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
                tolerated=image.tolerated,
            )
            for image in plan.task_images
        ),
    )
