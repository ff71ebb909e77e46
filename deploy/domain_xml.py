"""The lab domain's XML: templates/domain.xml filled in with ElementTree from a ``DomainSpec``.

The rendered definition carries, in our <metadata> namespace, the lab name and the digest of the
rest of the definition, so a fact can tell "defined as wanted" from "defined otherwise" without
comparing libvirt's expanded XML.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from runner.lab.layout import ARTIFACTS_MOUNT_TAG, GUEST_MIRROR_ADDRESS, GUEST_PROXY_ADDRESS
from runner.lab.libvirt import LAB_NAMESPACE, LAB_NAMESPACE_PREFIX

QEMU_NAMESPACE = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", QEMU_NAMESPACE)
ET.register_namespace(LAB_NAMESPACE_PREFIX, LAB_NAMESPACE)

PROXY_RELAY = "socat -"  # QEMU runs it per guest connection to the proxy, stdio is the guest side

GuestArch = Literal["aarch64", "x86_64"]
DomainType = Literal["kvm", "qemu"]


@dataclass(frozen=True)
class ArchProfile:
    machine: str
    features: tuple[str, ...]


ARCH_PROFILES: dict[str, ArchProfile] = {
    "aarch64": ArchProfile(machine="virt", features=()),
    "x86_64": ArchProfile(machine="q35", features=("acpi", "apic")),
}


def lab_uuid(lab: str) -> str:
    """Fixed per lab name, so a definition can replace itself ("already exists with uuid")."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{LAB_NAMESPACE}#{lab}"))


def authorized_key_parameter(public_key_line: str) -> str:
    """The image takes root's key from the kernel cmdline, base64 so it holds no spaces."""
    encoded = base64.b64encode(public_key_line.strip().encode()).decode()
    return f"lab.authorized_key={encoded}"


@dataclass(frozen=True)
class DomainSpec:
    lab: str
    name: str
    arch: GuestArch
    domain_type: DomainType
    cpu_model: str
    memory_mib: int
    vcpus: int
    kernel: str
    initrd: str
    # The image's own cmdline (root=LABEL=root rw console=...); the key is appended to it.
    kernel_cmdline: str
    disk: str
    console_log: str
    public_key_line: str
    ssh_port: int
    proxy_port: int
    # The lab's package mirror's loopback port (GUEST_MIRROR_ADDRESS in the guest); None: none.
    mirror_port: int | None = None
    # The host's artifact store, shared read-only with the guest over virtio-9p (deploy/guest
    # mounts it); "" shares nothing.
    artifacts_dir: str = ""


@dataclass(frozen=True)
class DomainDefinition:
    name: str
    xml: str
    spec_digest: str


def _netdev_arguments(spec: DomainSpec) -> tuple[str, ...]:
    # libvirt 9.0 has no passt backend: QEMU's own user netdev, restricted (no way out but the
    # two forwards), SSH on a host loopback port, the proxy reachable at one guest address.
    # The proxy forward runs a relay (socat, stdio <-> the proxy's loopback port) for each guest
    # connection: a chardev target instead is one stream that QEMU connects once, so a second
    # connection stalls while the first one's is closed and reconnected (measured: every other
    # request from the guest timed out). QEMU may only spawn it with libvirt's seccomp sandbox
    # off (deploy/hypervisor.py).
    forwards = [(GUEST_PROXY_ADDRESS, spec.proxy_port)]
    if spec.mirror_port is not None:
        forwards.append((GUEST_MIRROR_ADDRESS, spec.mirror_port))
    netdev = ",".join(
        [
            "user,id=net0,restrict=on",
            f"hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
            *(
                f"guestfwd=tcp:{address}-cmd:{PROXY_RELAY} TCP:127.0.0.1:{port}"
                for address, port in forwards
            ),
        ]
    )
    # romfile= : no option ROM (QEMU would look for efi-virtio.rom); the explicit slot keeps
    # clear of the root port libvirt places itself.
    device = "virtio-net-pci,netdev=net0,romfile=,bus=pcie.0,addr=0x1e"
    return ("-netdev", netdev, "-device", device)


def _fill(root: ET.Element, spec: DomainSpec) -> None:
    profile = ARCH_PROFILES[spec.arch]
    root.set("type", spec.domain_type)
    _find(root, "name").text = spec.name
    _find(root, "uuid").text = lab_uuid(spec.lab)
    _find(root, "memory").text = str(spec.memory_mib)
    _find(root, "vcpu").text = str(spec.vcpus)
    os_type = _find(root, "os/type")
    os_type.set("arch", spec.arch)
    os_type.set("machine", profile.machine)
    _find(root, "os/kernel").text = spec.kernel
    _find(root, "os/initrd").text = spec.initrd
    _find(
        root, "os/cmdline"
    ).text = f"{spec.kernel_cmdline} {authorized_key_parameter(spec.public_key_line)}"
    features = _find(root, "features")
    for feature in profile.features:
        ET.SubElement(features, feature)
    _find(root, "cpu/model").text = spec.cpu_model
    _find(root, "devices/disk/source").set("file", spec.disk)
    _find(root, "devices/serial/source").set("path", spec.console_log)
    if spec.artifacts_dir:
        share = ET.SubElement(_find(root, "devices"), "filesystem", type="mount")
        share.set("accessmode", "mapped")
        ET.SubElement(share, "source", dir=spec.artifacts_dir)
        ET.SubElement(share, "target", dir=ARTIFACTS_MOUNT_TAG)
        ET.SubElement(share, "readonly")
    commandline = _find(root, f"{{{QEMU_NAMESPACE}}}commandline")
    for argument in _netdev_arguments(spec):
        ET.SubElement(commandline, f"{{{QEMU_NAMESPACE}}}arg", value=argument)


def _find(root: ET.Element, path: str) -> ET.Element:
    element = root.find(path)
    if element is None:
        raise LookupError(f"templates/domain.xml has no <{path}>")
    return element


def render_domain(spec: DomainSpec) -> DomainDefinition:
    template = resources.files("deploy").joinpath("templates/domain.xml").read_text()
    root = ET.fromstring(template)
    _fill(root, spec)
    tag = ET.SubElement(_find(root, "metadata"), f"{{{LAB_NAMESPACE}}}lab", name=spec.lab)
    digest = "sha256:" + hashlib.sha256(ET.tostring(root)).hexdigest()
    tag.set("spec", digest)
    return DomainDefinition(
        name=spec.name, xml=ET.tostring(root, encoding="unicode"), spec_digest=digest
    )


def read_lab_tag(metadata_xml: str) -> tuple[str, str]:
    """(lab name, spec digest) from our <lab:lab> metadata element."""
    element = ET.fromstring(metadata_xml)
    return element.get("name", ""), element.get("spec", "")
