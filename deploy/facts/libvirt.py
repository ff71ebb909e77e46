"""Facts about libvirt objects, read through libvirt-python over the hypervisor's libvirt URI.

pyinfra's own facts are shell commands run on the target; libvirt state is read through
libvirt's API instead (``host.data.libvirt_uri``: ``qemu:///system`` here, ``qemu+ssh://`` for a
remote hypervisor), so these facts have a ``read(conn, ...)`` where pyinfra's have a ``command``
and a ``process``. Each returns one shape: an absent object is a ``state`` of ``"absent"``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Generic, Literal, TypedDict, TypeVar

import libvirt
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage

from deploy.domain_xml import read_lab_tag
from runner.lab import libvirt as virt

T = TypeVar("T")


class LibvirtFact(Generic[T]):
    def read(self, conn: libvirt.virConnect, **kwargs: Any) -> T:
        raise NotImplementedError

    def default(self) -> T:
        """What a fact is while libvirt cannot be reached yet (prepare stage only)."""
        raise NotImplementedError


def get_libvirt_fact(host: Host, fact: type[LibvirtFact[T]], **kwargs: Any) -> T:
    """Read ``fact`` on ``host``'s libvirt.

    Like pyinfra's facts whose command is not installed yet, an unreachable libvirt gives the
    fact's default while the deploy is being prepared (an earlier operation starts libvirtd),
    and is an error while it executes.
    """
    instance = fact()
    try:
        conn = virt.connect(host.data.libvirt_uri)
    except virt.LibvirtUnreachable:
        if host.state.current_stage < StateStage.Execute:
            return instance.default()
        raise
    return instance.read(conn, **kwargs)


class PoolInfo(TypedDict):
    state: Literal["absent", "inactive", "active"]
    path: str
    autostart: bool


class StoragePool(LibvirtFact[PoolInfo]):
    """A storage pool: whether it exists and runs, and its target directory."""

    def default(self) -> PoolInfo:
        return {"state": "absent", "path": "", "autostart": False}

    def read(self, conn: libvirt.virConnect, **kwargs: Any) -> PoolInfo:
        pool = virt.find_pool(conn, kwargs["pool"])
        if pool is None:
            return self.default()
        path = ET.fromstring(pool.XMLDesc(0)).findtext("target/path", default="")
        return {
            "state": "active" if pool.isActive() else "inactive",
            "path": path,
            "autostart": bool(pool.autostart()),
        }


class VolumeInfo(TypedDict):
    state: Literal["absent", "present"]
    path: str
    capacity: int
    physical: int
    format: str
    backing_path: str


class StorageVolume(LibvirtFact[VolumeInfo]):
    """A volume of a pool (absent too when its pool is absent or inactive)."""

    def default(self) -> VolumeInfo:
        return {
            "state": "absent",
            "path": "",
            "capacity": 0,
            "physical": 0,
            "format": "",
            "backing_path": "",
        }

    def read(self, conn: libvirt.virConnect, **kwargs: Any) -> VolumeInfo:
        pool = virt.find_pool(conn, kwargs["pool"])
        volume = None if pool is None else virt.find_volume(pool, kwargs["volume"])
        if volume is None:
            return self.default()
        root = ET.fromstring(volume.XMLDesc(0))
        volume_format = root.find("target/format")
        return {
            "state": "present",
            "path": volume.path(),
            "capacity": int(root.findtext("capacity", default="0")),
            # Bytes of the file itself (capacity is a qcow2's virtual size).
            "physical": int(root.findtext("physical", default="0")),
            "format": "" if volume_format is None else volume_format.get("type", ""),
            "backing_path": root.findtext("backingStore/path", default=""),
        }


class DomainInfo(TypedDict):
    state: str
    ours: bool
    lab: str
    defined_spec: str
    running_spec: str


class Domain(LibvirtFact[DomainInfo]):
    """A domain: its state, whether it carries our lab tag, and the spec digests it was defined
    and started with (``running_spec`` is empty unless it runs)."""

    def default(self) -> DomainInfo:
        return {"state": "absent", "ours": False, "lab": "", "defined_spec": "", "running_spec": ""}

    def read(self, conn: libvirt.virConnect, **kwargs: Any) -> DomainInfo:
        domain = virt.find_domain(conn, kwargs["domain"])
        if domain is None:
            return self.default()
        defined = virt.lab_metadata(domain, live=False)
        running = virt.lab_metadata(domain, live=True) if domain.isActive() else None
        lab, defined_spec = read_lab_tag(defined) if defined else ("", "")
        return {
            "state": virt.domain_state(domain),
            "ours": defined is not None,
            "lab": lab,
            "defined_spec": defined_spec,
            "running_spec": read_lab_tag(running)[1] if running else "",
        }
