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
