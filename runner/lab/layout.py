"""Where the provisioned guest keeps things: the one map shared by deploy/guest and the executor.

/srv/artifacts/                      the host's artifact store, read-only over virtio-9p
    sha256/<hex>                     (mount tag ``artifacts``; nothing is copied to read it)
/opt/bench/
    node/bin/node                    Node, for the guest itself (``pi --version``)
    bun/bin/bun                      Bun
    harbor/bin/harbor                Harbor's venv; ``python/`` is on its path
    python/runner/                   the repository's runner package (``runner.harbor_agents``)
    runtimes/<runtime>-<version>/    the frozen artifacts a task container runs the harness
    harnesses/<harness id>/          from (runner.guest.agent_plan.ArtifactPaths), bound
        node_modules/.bin/pi|omp     read-only into it at /bench/artifacts
    compiled/<harness id>/jiti/      a warm harness's compiled extensions (empty when none is)
/srv/tasks/<task id>/                Harbor task dirs (task.toml, environment/, tests/, ...)
/srv/trials/<cell>/                  Harbor's ``--trials-dir`` for one cell
/var/lib/bench/units/<unit>          what each provisioning unit installed (a digest)

Harbor runs as root against Podman's Docker-compatible socket (``DOCKER_HOST``); the harness
runs in the task container, and ``bench`` is the unprivileged agent user in the guest.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import ClassVar

from runner.guest.agent_plan import DEFAULT_ARTIFACTS_DIR, ArtifactPaths
from runner.guest.task_images import task_image

ARTIFACTS_MOUNT_TAG = "artifacts"
AGENT_USER = "bench"
PODMAN_SOCKET = PurePosixPath("/run/podman/podman.sock")
DOCKER_HOST = f"unix://{PODMAN_SOCKET}"
# Python of the guest's Debian suite (trixie): the venv's site-packages is named after it.
GUEST_PYTHON = "3.13"
# The host's model proxy as the guest reaches it: an address of QEMU's user-mode network only,
# which the lab's guestfwd relays to the proxy's host loopback port (no traffic leaves loopback).
GUEST_PROXY_ADDRESS = "10.0.2.100:8080"
GUEST_PROXY_URL = f"http://{GUEST_PROXY_ADDRESS}"
# The lab's package mirror (runner.lab.mirror) as the guest and its containers reach it: another
# guestfwd to a host loopback port. It serves the frozen Debian packages and wheels, nothing else.
# Harbor's environment in the guest (its --env): Docker's, on the frozen task images.
HARBOR_ENVIRONMENT = "runner.guest.harbor_environment:FrozenLabEnvironment"
GUEST_MIRROR_ADDRESS = "10.0.2.101:80"
GUEST_MIRROR_URL = f"http://{GUEST_MIRROR_ADDRESS}"


class GuestLayout:
    bench: ClassVar = PurePosixPath("/opt/bench")
    artifacts_mount: ClassVar = PurePosixPath("/srv/artifacts")
    tasks_dir: ClassVar = PurePosixPath("/srv/tasks")
    trials_dir: ClassVar = PurePosixPath("/srv/trials")
    units_dir: ClassVar = PurePosixPath("/var/lib/bench/units")
    # Each task image's build output, and its exit status if it failed (runner.guest.build_report)
    build_logs: ClassVar = PurePosixPath("/var/lib/bench/builds")

    def blob(self, digest: str) -> PurePosixPath:
        """An artifact of the host store as the guest reads it (``sha256:<hex>`` digest)."""
        return self.artifacts_mount / "sha256" / digest.removeprefix("sha256:")

    @property
    def node_dir(self) -> PurePosixPath:
        return self.bench / "node"

    @property
    def bun_dir(self) -> PurePosixPath:
        return self.bench / "bun"

    @property
    def verifier_root(self) -> PurePosixPath:
        """Files laid over the tasks' local base image (lock tasks.verifier: uv, its config)."""
        return self.bench / "verifier-root"

    def runtime_bin(self, runtime: str) -> PurePosixPath:
        """``node`` or ``bun`` as the guest runs it."""
        return self.bench / runtime / "bin" / runtime

    @property
    def harbor_venv(self) -> PurePosixPath:
        return self.bench / "harbor"

    @property
    def harbor(self) -> PurePosixPath:
        return self.harbor_venv / "bin" / "harbor"

    @property
    def site_packages(self) -> PurePosixPath:
        return self.harbor_venv / "lib" / f"python{GUEST_PYTHON}" / "site-packages"

    @property
    def python_path(self) -> PurePosixPath:
        return self.bench / "python"

    @property
    def container_artifacts(self) -> ArtifactPaths:
        """The task containers' frozen artifacts, as laid out in the guest."""
        return ArtifactPaths(self.bench)

    @property
    def image_artifacts(self) -> ArtifactPaths:
        """The same artifacts as a task container sees them (the agents' default location)."""
        return ArtifactPaths(PurePosixPath(DEFAULT_ARTIFACTS_DIR))

    @property
    def container_mounts(self) -> tuple[dict[str, object], ...]:
        """The runtimes and harness trees bound read-only into every task container (Docker
        Compose service-volume form, as Harbor's ``--mounts`` takes them). Baking them into the
        base image instead cost minutes of ``podman import`` under TCG, and a copy per image."""
        guest, container = self.container_artifacts, self.image_artifacts
        return tuple(
            {"type": "bind", "source": str(source), "target": str(target), "read_only": True}
            for source, target in (
                (guest.runtimes, container.runtimes),
                (guest.harnesses, container.harnesses),
                (guest.compiled_caches, container.compiled_caches),
            )
        )

    @property
    def podman_volumes(self) -> str:
        """``container_mounts`` as ``podman run`` options, for a container run outside Harbor."""
        return " ".join(
            "-v " + shlex.quote(f"{mount['source']}:{mount['target']}:ro")
            for mount in self.container_mounts
        )

    def harness_tree(self, harness_id: str) -> PurePosixPath:
        return self.container_artifacts.harness_tree(harness_id)

    def harness_command(self, harness_id: str, agent: str) -> PurePosixPath:
        return self.harness_tree(harness_id) / "node_modules" / ".bin" / agent

    def task(self, task_id: str) -> PurePosixPath:
        return self.tasks_dir / task_id

    def task_image(self, task_id: str) -> str:
        """The task's image, built when the guest is provisioned (every cell's container's)."""
        return task_image(task_id)

    def trials(self, cell: str) -> PurePosixPath:
        return self.trials_dir / cell

    def unit_stamp(self, unit: str) -> PurePosixPath:
        return self.units_dir / unit


GUEST = GuestLayout()
