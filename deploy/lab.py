"""The lab VM: its controller-side state (keys, ports, acceleration) and its convergence.

``prepare_lab`` runs while pyinfra prepares the deploy: it settles what must stay the same across
runs (the SSH key, the loopback ports, the acceleration chosen) and writes lab.json before
anything exists on the hypervisor, so ``runner teardown`` can clean up a half-made lab.
``lab_vm`` is the pyinfra deploy that converges the hypervisor to that state.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.deploy import deploy
from rich.console import Console

from deploy.acceleration import choose_acceleration
from deploy.domain_xml import DomainSpec, lab_uuid, render_domain
from deploy.operations import libvirt
from images.manifest import ImageManifest
from images.paths import ImagePaths
from runner.cache.paths import CachePaths
from runner.core.files import read_model, write_model
from runner.lab import libvirt as virt
from runner.lab.state import HypervisorPaths, ImageRef, LabPaths, LabState, libvirt_name
from runner.lab.teardown import remove_orphaned_lab
from runner.spec.lock import Lock

# Boot to SSH under TCG took 81-112 s on an idle 2-core host, over 9 minutes with three TCG
# guests sharing it.
SSH_WAIT_SECONDS = 900.0


@dataclass(frozen=True)
class LabVolumes:
    """Volume names in the lab's pool; image volumes carry their file's digest."""

    base: str
    kernel: str
    initrd: str
    overlay: str

    @classmethod
    def for_lab(cls, domain_name: str, manifest: ImageManifest) -> LabVolumes:
        def short(name: str) -> str:
            return manifest.files[name].removeprefix("sha256:")[:16]  # type: ignore[index]

        return cls(
            base=f"base-{short('root.qcow2')}.qcow2",
            kernel=f"vmlinuz-{short('vmlinuz')}",
            initrd=f"initrd-{short('initrd.img')}.img",
            overlay=f"{domain_name}.qcow2",
        )


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ensure_key_pair(paths: LabPaths) -> None:
    if paths.private_key.exists() and paths.public_key.exists():
        return
    paths.private_key.unlink(missing_ok=True)
    paths.public_key.unlink(missing_ok=True)
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"lab-{paths.lab_dir.name}",
            "-f",
            str(paths.private_key),
        ],
        check=True,
    )


def _previous_state(paths: LabPaths) -> LabState | None:
    if not paths.state.exists():
        return None
    return read_model(paths.state, LabState)


def prepare_lab(
    lab: str,
    lock: Lock,
    manifest: ImageManifest,
    image: ImagePaths,
    libvirt_uri: str,
    hypervisor: HypervisorPaths,
) -> LabState:
    paths = LabPaths.for_lab(lab)
    paths.lab_dir.mkdir(parents=True, exist_ok=True)
    # The domain shares the artifact store with the guest: QEMU wants the directory to exist.
    CachePaths.default().artifacts.mkdir(parents=True, exist_ok=True)
    _ensure_key_pair(paths)
    # A domain or pool of the lab's name left by a removed checkout (CI clones, a wiped cache)
    # would make this deploy start a pool with no directory or a VM with no disk.
    for removed in remove_orphaned_lab(lab, libvirt_uri):
        Console(stderr=True, soft_wrap=True).print(
            f"lab {lab}: left behind with its files gone: {removed}"
        )
    previous = _previous_state(paths)
    name = libvirt_name(lab)
    if previous is not None and previous.guest_arch == lock.guest.arch:
        acceleration = previous.acceleration
        ssh_port, proxy_port = previous.ssh_port, previous.proxy_port
        mirror_port = previous.mirror_port or _free_loopback_port()
        # Pinned when the guest first answered; its disk keeps its key until `runner rebuild`.
        ssh_host_key = previous.ssh_host_key
    else:
        acceleration = choose_acceleration(
            virt.connect(libvirt_uri), lock.guest.arch, str(image.vmlinuz), str(image.initrd)
        )
        ssh_port, proxy_port = _free_loopback_port(), _free_loopback_port()
        mirror_port = _free_loopback_port()
        ssh_host_key = None
    volumes = LabVolumes.for_lab(name, manifest)
    state = LabState(
        lab=lab,
        environment_fingerprint=lock.environment_fingerprint,
        libvirt_uri=libvirt_uri,
        domain_name=name,
        domain_uuid=lab_uuid(lab),
        guest_arch=lock.guest.arch,
        acceleration=acceleration,
        pool_name=name,
        pool_dir=str(hypervisor.pool_dir),
        overlay_path=str(hypervisor.pool_dir / volumes.overlay),
        console_log=str(hypervisor.console_log),
        ssh_port=ssh_port,
        proxy_port=proxy_port,
        mirror_port=mirror_port,
        ssh_host_key=ssh_host_key,
        private_key=str(paths.private_key),
        image=ImageRef(
            store_dir=str(image.dir),
            input_hash=manifest.input_hash,
            root_sha256=manifest.files["root.qcow2"],
        ),
    )
    if state != previous:
        write_model(paths.state, state)
    return state


def domain_spec(state: LabState, lock: Lock, manifest: ImageManifest) -> DomainSpec:
    volumes = LabVolumes.for_lab(state.domain_name, manifest)
    pool_dir = Path(state.pool_dir)
    return DomainSpec(
        lab=state.lab,
        name=state.domain_name,
        arch=state.guest_arch,
        domain_type="kvm" if state.acceleration.kind == "kvm" else "qemu",
        cpu_model=lock.guest.cpu_model,
        memory_mib=lock.guest.memory_mib,
        vcpus=lock.guest.vcpus,
        kernel=str(pool_dir / volumes.kernel),
        initrd=str(pool_dir / volumes.initrd),
        kernel_cmdline=manifest.kernel_cmdline,
        disk=state.overlay_path,
        console_log=state.console_log,
        public_key_line=Path(state.private_key).with_suffix(".pub").read_text(),
        ssh_port=state.ssh_port,
        proxy_port=state.proxy_port,
        mirror_port=state.mirror_port,
        artifacts_dir=str(CachePaths.default().artifacts),
    )


@deploy("Lab VM")
def lab_vm(state: LabState, lock: Lock, manifest: ImageManifest, image: ImagePaths) -> None:
    volumes = LabVolumes.for_lab(state.domain_name, manifest)
    pool_dir = Path(state.pool_dir)
    libvirt.dir_pool(name="Lab storage pool", pool=state.pool_name, path=state.pool_dir)
    for volume, source in (
        (volumes.base, image.root_qcow2),
        (volumes.kernel, image.vmlinuz),
        (volumes.initrd, image.initrd),
    ):
        libvirt.uploaded_volume(
            name=f"Image file {volume}", pool=state.pool_name, volume=volume, source=str(source)
        )
    libvirt.overlay_volume(
        name="Overlay over the base image",
        pool=state.pool_name,
        volume=volumes.overlay,
        backing_path=str(pool_dir / volumes.base),
        capacity=manifest.disk_gib << 30,
    )
    libvirt.domain(
        name=f"Lab domain ({state.acceleration.kind}: {state.acceleration.reason})",
        definition=render_domain(domain_spec(state, lock, manifest)),
    )
