"""The lab: one libvirt VM built from the image, and the file that says how to reach it.

``deploy.py`` writes ``lab.json`` before it creates anything on the hypervisor (so a half-failed
create can still be torn down) and again when the acceleration is known; the runner reads it to
reach the guest (runner.lab.transport, pinned to the host key runner.lab.host_key records) and
to tear the lab down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from runner.core.files import read_model
from runner.core.models import FrozenModel, Sha256, Slug
from runner.core.roots import cache_root

DEFAULT_LAB = "default"
# The serial console's file in the lab's pool: libvirt lists it as a volume after a refresh.
CONSOLE_LOG_VOLUME = "console.log"


def libvirt_name(lab: str) -> str:
    """The name of the lab's libvirt domain and of its storage pool."""
    return f"frozen-bench-{lab}"


def lab_name_from_env() -> str:
    """The lab a command acts on when no ``--lab`` is given: ``$LAB``, else ``default``."""
    return os.environ.get("LAB", DEFAULT_LAB)


@dataclass(frozen=True)
class LabPaths:
    """Owns ``<repo>/.cache/lab/<lab>/`` on the controller; no other code names these files.

    <repo>/.cache/lab/<lab>/
        lab.json          LabState: how to reach and tear down the lab
        id_ed25519        root's SSH key for the guest (private; mode 600)
        id_ed25519.pub    its public half, passed to the guest on the kernel cmdline
        known_hosts       the guest's SSH host key as lab.json pins it (runner.lab.host_key), for
                          pyinfra's guest connector and Ansible
        pool/             the lab's libvirt dir pool when the hypervisor is this machine
                          (HypervisorPaths; a remote hypervisor has it under its own root)
    """

    lab_dir: Path

    @classmethod
    def for_lab(cls, lab: str) -> LabPaths:
        return cls(cache_root() / "lab" / lab)

    @property
    def state(self) -> Path:
        return self.lab_dir / "lab.json"

    @property
    def private_key(self) -> Path:
        return self.lab_dir / "id_ed25519"

    @property
    def public_key(self) -> Path:
        return self.lab_dir / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.lab_dir / "known_hosts"

    @property
    def mirror_log(self) -> Path:
        """Every request the lab's package mirror answered (runner.lab.mirror), JSON Lines."""
        return self.lab_dir / "mirror.jsonl"

    @property
    def local_pool_dir(self) -> Path:
        return self.lab_dir / "pool"


@dataclass(frozen=True)
class HypervisorPaths:
    """The lab's files on the hypervisor's filesystem (possibly a remote machine's).

    <pool_dir>/           libvirt dir pool "frozen-bench-<lab>"
        base-<sha16>.qcow2    copy of the image's root.qcow2 (backing file)
        vmlinuz-<sha16>       the image's kernel (direct kernel boot)
        initrd-<sha16>.img    the image's initrd
        frozen-bench-<lab>.qcow2  the overlay the guest writes
        console.log           the serial console (in the pool, so deleting the pool's
                              volumes removes it too, even on a remote hypervisor)
    """

    pool_dir: Path

    @property
    def console_log(self) -> Path:
        return self.pool_dir / CONSOLE_LOG_VOLUME


class Acceleration(FrozenModel):
    """How QEMU runs the guest, and why that was chosen (reported by ``runner status``)."""

    kind: Literal["kvm", "tcg"]
    reason: str = Field(min_length=1)


class ImageRef(FrozenModel):
    """The base image the lab was built from (from images/' manifest.json)."""

    store_dir: str
    input_hash: str
    root_sha256: Sha256


class LabState(FrozenModel):
    schema_version: Literal[1] = 1
    lab: Slug
    # The lock's environment fingerprint: what the guest was provisioned from.
    environment_fingerprint: str
    libvirt_uri: str
    domain_name: str
    domain_uuid: str
    guest_arch: Literal["aarch64", "x86_64"]
    acceleration: Acceleration
    pool_name: str
    pool_dir: str
    overlay_path: str
    console_log: str
    ssh_host: str = "127.0.0.1"
    ssh_port: int = Field(ge=1024, le=65535)
    ssh_user: str = "root"
    private_key: str
    # QEMU forwards the guest's layout.GUEST_PROXY_ADDRESS to this loopback port (the proxy).
    proxy_port: int = Field(ge=1024, le=65535)
    image: ImageRef
    # QEMU forwards layout.GUEST_MIRROR_ADDRESS to this loopback port: the lab's package mirror
    # (runner.lab.mirror), which serves the task builds and verifiers the frozen set only.
    mirror_port: int | None = Field(default=None, ge=1024, le=65535)
    # The guest's SSH host key, "ssh-ed25519 <base64>", read from its console when it first
    # answered (runner.lab.host_key); every client refuses any other. None until then.
    ssh_host_key: str | None = Field(default=None, pattern=r"^ssh-ed25519 [A-Za-z0-9+/]+=*$")

    LATE_FIELDS = frozenset({"mirror_port", "ssh_host_key"})


def load_lab_state(paths: LabPaths) -> LabState:
    return read_model(paths.state, LabState)
