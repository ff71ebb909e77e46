"""The one lab domain spec of the libvirt and guest-share unit tests."""

from __future__ import annotations

from deploy.domain_xml import DomainSpec

LAB = "t"
DOMAIN = "frozen-bench-t"
POOL = "frozen-bench-t"

SPEC = DomainSpec(
    lab=LAB,
    name=DOMAIN,
    arch="aarch64",
    domain_type="qemu",
    cpu_model="cortex-a57",
    memory_mib=512,
    vcpus=2,
    kernel="/pools/t/vmlinuz-1",
    initrd="/pools/t/initrd-1.img",
    kernel_cmdline="root=LABEL=root rw console=ttyAMA0",
    disk="/pools/t/frozen-bench-t.qcow2",
    console_log="/pools/t/console.log",
    public_key_line="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK lab-t\n",
    ssh_port=40022,
    proxy_port=40080,
)
