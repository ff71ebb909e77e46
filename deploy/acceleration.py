"""KVM or TCG: KVM only when the host can run the guest's arch natively AND a KVM guest starts.

Nested or unusable KVM often fails only once the guest kernel runs ("KVM internal error", a
paused guest; firmware alone ran fine under nested KVM on our x86_64 host), so the probe boots
the lab's own kernel and initrd in a transient KVM domain for a few seconds and looks at it.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import libvirt

from deploy.domain_xml import ARCH_PROFILES, GuestArch
from runner.lab import libvirt as virt
from runner.lab.state import Acceleration

_PROBE_SECONDS = 10.0


def _probe_xml(arch: GuestArch, kernel: str, initrd: str) -> str:
    domain = ET.Element("domain", type="kvm")
    ET.SubElement(domain, "name").text = "frozen-bench-kvm-probe"
    ET.SubElement(domain, "memory", unit="MiB").text = "128"
    os_element = ET.SubElement(domain, "os")
    ET.SubElement(os_element, "type", arch=arch, machine=ARCH_PROFILES[arch].machine).text = "hvm"
    ET.SubElement(os_element, "kernel").text = kernel
    ET.SubElement(os_element, "initrd").text = initrd
    ET.SubElement(domain, "cpu", mode="host-passthrough")
    ET.SubElement(ET.SubElement(domain, "devices"), "memballoon", model="none")
    return ET.tostring(domain, encoding="unicode")


def _kvm_guest_runs(
    conn: libvirt.virConnect, arch: GuestArch, kernel: str, initrd: str
) -> str | None:
    """None when a KVM guest ran for a few seconds; otherwise what went wrong."""
    try:
        probe = conn.createXML(_probe_xml(arch, kernel, initrd), 0)
    except libvirt.libvirtError as error:
        return f"a KVM guest did not start: {error}"
    try:
        time.sleep(_PROBE_SECONDS)
        state = virt.domain_state(probe)
        return None if state == "running" else f"a KVM guest started but is {state}"
    finally:
        if probe.isActive():
            probe.destroy()


def choose_acceleration(
    conn: libvirt.virConnect, guest_arch: GuestArch, kernel: str, initrd: str
) -> Acceleration:
    """``kernel``/``initrd``: the image's, as paths on the hypervisor."""
    capabilities = ET.fromstring(conn.getCapabilities())
    host_arch = capabilities.findtext("host/cpu/arch", default="unknown")
    if host_arch != guest_arch:
        return Acceleration(
            kind="tcg", reason=f"host is {host_arch}, guest is {guest_arch}: KVM cannot run it"
        )
    offers_kvm = capabilities.find(f"guest/arch[@name='{guest_arch}']/domain[@type='kvm']")
    if offers_kvm is None:
        return Acceleration(kind="tcg", reason=f"libvirt offers no KVM for {guest_arch} here")
    failure = _kvm_guest_runs(conn, guest_arch, kernel, initrd)
    if failure is not None:
        return Acceleration(kind="tcg", reason=f"{failure}; falling back to TCG")
    return Acceleration(kind="kvm", reason=f"host and guest are {guest_arch} and a KVM guest ran")
