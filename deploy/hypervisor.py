"""The hypervisor's prerequisites: packages, libvirt's daemons, binfmt for a foreign guest arch,
and /dev/kvm for libvirt's qemu user where KVM may be used."""

from __future__ import annotations

from pyinfra.api.deploy import deploy
from pyinfra.context import host
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from deploy.domain_xml import GuestArch
from deploy.operations import host as host_ops

COMMON_PACKAGES = (
    "libvirt-daemon-system",
    "libvirt-clients",
    "qemu-utils",
    "qemu-user-static",
    "binfmt-support",
    "openssh-client",
    "socat",  # the relay QEMU runs per guest connection to the proxy (deploy/domain_xml.py)
)
QEMU_CONF = "/etc/libvirt/qemu.conf"
# The system emulator for each guest arch (qemu-efi-aarch64: libvirt's capabilities probe
# wants the firmware present even though the lab boots its kernel directly).
EMULATOR_PACKAGES: dict[str, tuple[str, ...]] = {
    "aarch64": ("qemu-system-arm", "qemu-efi-aarch64"),
    "x86_64": ("qemu-system-x86",),
}


@deploy("Hypervisor prerequisites")
def hypervisor_prerequisites(guest_arch: GuestArch) -> None:
    host_ops.packages_installed(
        name="Install libvirt, QEMU and image tools",
        packages=[*COMMON_PACKAGES, *EMULATOR_PACKAGES[guest_arch]],
    )
    # libvirt starts QEMU with a seccomp filter that forbids it to spawn processes; the proxy's
    # guest forward spawns a relay per connection. (scripts/setup-host.sh sets this before it
    # first starts libvirtd, so there this changes nothing.)
    sandbox = files.line(
        name="QEMU may spawn the proxy relay (libvirt's seccomp sandbox off)",
        path=QEMU_CONF,
        line=r"^#?\s*seccomp_sandbox\s*=.*$",
        replace="seccomp_sandbox = 0",
    )
    for daemon_name in ("virtlogd", "libvirtd"):
        host_ops.daemon(name=f"Start {daemon_name}", daemon_name=daemon_name)
    host_ops.daemon_restarted(
        name="Restart libvirtd (its QEMU config changed)",
        daemon_name="libvirtd",
        _if=sandbox.did_change,
    )
    if host.get_fact(Arch) != guest_arch:
        host_ops.binfmt(
            name=f"Run {guest_arch} binaries (image build)", handler=f"qemu-{guest_arch}"
        )
    else:
        host_ops.device_access(
            name="Let libvirt's qemu user open /dev/kvm", path="/dev/kvm", group="kvm", mode="660"
        )
