"""Remove a lab completely: domain (with snapshot metadata), pool and every volume in it
(base copy, kernel, initrd, overlay, console log), and the controller's lab directory.

Every step looks before it acts, so a half-made lab (a create that failed anywhere) is removed
and a second teardown finds nothing. A domain of the lab's name without our tag is refused.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import libvirt

from runner.core.errors import InputError, RunnerError
from runner.core.files import read_model
from runner.lab import libvirt as virt
from runner.lab.state import LabPaths, LabState, libvirt_name

DEFAULT_URI = "qemu:///system"


def _undefine_flags(domain: libvirt.virDomain) -> int:
    flags: int = (
        libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    )
    # Only asked for when the domain has NVRAM: some drivers reject the flag otherwise.
    if ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).find("os/nvram") is not None:
        flags |= libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    return flags


def _remove_domain(conn: libvirt.virConnect, name: str) -> list[str]:
    domain = virt.find_domain(conn, name)
    if domain is None:
        return []
    if virt.lab_metadata(domain, live=False) is None:
        raise RunnerError(f"domain {name} exists but is not a lab domain: not touching it")
    removed = []
    if domain.isActive():
        domain.destroy()
        removed.append(f"stopped domain {name}")
    if domain.isPersistent():
        snapshots = domain.snapshotNum(0)
        domain.undefineFlags(_undefine_flags(domain))
        removed.append(f"undefined domain {name} ({snapshots} snapshots)")
    return removed


def _remove_pool(conn: libvirt.virConnect, name: str) -> list[str]:
    pool = virt.find_pool(conn, name)
    if pool is None:
        return []
    removed = []
    if not pool.isActive():
        try:
            pool.create(0)
        except libvirt.libvirtError:
            pool.undefine()  # its directory is gone already: nothing left to delete in it
            return [f"undefined pool {name}"]
    pool.refresh(0)  # files libvirt did not create (the console log) become volumes
    for volume in pool.listAllVolumes(0):
        volume.delete(0)
        removed.append(f"deleted volume {volume.name()}")
    pool.destroy()
    pool.delete(0)
    pool.undefine()
    removed.append(f"deleted pool {name}")
    return removed


def _pool_directory_gone(pool: libvirt.virStoragePool) -> bool:
    """Whether a pool's directory is gone on its hypervisor: libvirt cannot start or list it."""
    try:
        if pool.isActive():
            pool.refresh(0)
        else:
            pool.create(0)
    except libvirt.libvirtError:
        return True
    return False


def _domain_disk_gone(conn: libvirt.virConnect, domain: libvirt.virDomain) -> bool:
    """Whether a lab domain's disk is gone (no volume of that path on its hypervisor)."""
    root = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    disk = root.find("devices/disk/source")
    path = "" if disk is None else disk.get("file", "")
    if not path:
        return False
    try:
        conn.storageVolLookupByPath(path)
    except libvirt.libvirtError:
        return True
    return False


def remove_orphaned_lab(lab: str, uri: str) -> list[str]:
    """Remove lab ``lab``'s domain and pool when what they stand on is gone: the pool's directory
    (a checkout or cache removed while libvirt kept its definitions), or the lab domain's disk.
    Nothing of such a lab can be used again, and a deploy would trip over it. A lab whose files
    are still there is left alone (it may be another checkout's). Returns what was removed."""
    conn = virt.connect(uri)
    name = libvirt_name(lab)
    pool = virt.find_pool(conn, name)
    domain = virt.find_domain(conn, name)
    if domain is not None and virt.lab_metadata(domain, live=False) is None:
        return []  # not ours: the deploy's domain operation refuses it in one line
    orphaned = (pool is not None and _pool_directory_gone(pool)) or (
        domain is not None and _domain_disk_gone(conn, domain)
    )
    return _remove_domain(conn, name) + _remove_pool(conn, name) if orphaned else []


def _recorded_uri(paths: LabPaths) -> str | None:
    """lab.json's libvirt URI; None when there is none or it no longer validates (an older
    schema, say): teardown must still work then."""
    try:
        return read_model(paths.state, LabState).libvirt_uri
    except InputError:
        return None


def teardown_lab(lab: str, paths: LabPaths, uri: str | None = None) -> list[str]:
    """Remove lab ``lab`` (controller files in ``paths``); returns what was removed (empty:
    nothing to do). The libvirt URI is ``uri``, else lab.json's, else qemu:///system.
    """
    conn = virt.connect(uri or _recorded_uri(paths) or DEFAULT_URI)
    name = libvirt_name(lab)
    removed = _remove_domain(conn, name) + _remove_pool(conn, name)
    if paths.lab_dir.exists():
        shutil.rmtree(paths.lab_dir)
        removed.append(f"deleted {paths.lab_dir}")
    return removed
