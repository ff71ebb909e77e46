"""The frozen state of a lab domain on the hypervisor: a saved memory image over a disk layer
that is never written again, and a throwaway layer the guest writes to.

    <pool>/<domain>.qcow2            deploy's overlay; from the freeze on, the FROZEN disk
    <pool>/<domain>-frozen.save      QEMU's memory and device state at the freeze (virsh save)
    <pool>/<domain>-live.qcow2       what the guest writes: a fresh qcow2 over the frozen disk

Freeze: fold any live layer of an earlier freeze back into the frozen disk (active block
commit), save the domain (it stops), put a new live layer over the frozen disk and restore the
image with the disk pointed at that layer. Reset: destroy, new live layer, restore. Nothing
boots and no disk is copied: a reset costs QEMU reading the memory image, which the host's page
cache usually holds. Internal snapshots (``snapshot-create --atomic``, revert 8.8 s here) keep
the memory state inside the qcow2 and read it back through the qcow2 layer; this is faster.

libvirt is called through runner.lab.libvirt (connection, look-ups with "absent" as None); libvirt
errors of the calls made here become one ``SnapshotError`` line.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Literal

import libvirt

from runner.core.errors import RunnerError
from runner.core.models import FrozenModel
from runner.lab import libvirt as virt
from runner.lab.state import LabState

_COMMIT_TIMEOUT_SECONDS = 600.0


class SnapshotError(RunnerError):
    """The frozen state could not be saved or restored."""


class SavedState(FrozenModel):
    """Where a lab's frozen state is, and what must still hold for a reset to return to it."""

    schema_version: Literal[1] = 1
    lab: str
    domain_name: str
    freeze_manifest_sha256: str
    saved_at: datetime
    memory_image: str
    frozen_disk: str
    # "<path>@<mtime>" of the frozen disk and each file under it (its backing chain) at the
    # freeze: if any changes, the memory image no longer matches the disk, and restoring it
    # would corrupt the guest's filesystem.
    frozen_chain: tuple[str, ...]
    live_disk: str
    restore_xml: str  # the saved domain XML with its disk on the live layer


@contextmanager
def _libvirt_errors(doing: str) -> Iterator[None]:
    try:
        yield
    except libvirt.libvirtError as error:
        raise SnapshotError(f"{doing}: {error.get_error_message()}") from None


def _lab_domain(conn: libvirt.virConnect, lab: LabState) -> libvirt.virDomain:
    domain = virt.find_domain(conn, lab.domain_name)
    if domain is None or virt.lab_metadata(domain, live=False) is None:
        raise SnapshotError(f"no lab domain {lab.domain_name} at {lab.libvirt_uri}")
    return domain


def _pool(conn: libvirt.virConnect, lab: LabState) -> libvirt.virStoragePool:
    pool = virt.find_pool(conn, lab.pool_name)
    if pool is None or not pool.isActive():
        raise SnapshotError(f"the lab's storage pool {lab.pool_name} is not active")
    pool.refresh(0)  # files libvirt did not create itself (the memory image) become volumes
    return pool


def _disk(domain_xml: str) -> ET.Element:
    disk = ET.fromstring(domain_xml).find("devices/disk[@device='disk']")
    if disk is None:
        raise SnapshotError("the lab domain has no disk")
    return disk


def _disk_source(domain: libvirt.virDomain) -> tuple[str, str]:
    """(target dev, source file) of the domain's disk as it runs."""
    disk = _disk(domain.XMLDesc(0))
    return disk.find("target").get("dev", ""), disk.find("source").get("file", "")  # type: ignore[union-attr]


def running_disk(lab: LabState) -> str:
    """The file the lab domain's disk writes to now (its live layer, after a freeze)."""
    domain = _lab_domain(virt.connect(lab.libvirt_uri), lab)
    if not domain.isActive():
        raise SnapshotError(f"lab domain {lab.domain_name} is not running")
    return _disk_source(domain)[1]


def with_disk(domain_xml: str, path: str) -> str:
    """``domain_xml`` with its disk on ``path``; the backing chain is left for libvirt to probe
    (the saved XML describes the chain under the frozen disk, not under ``path``)."""
    root = ET.fromstring(domain_xml)
    disk = root.find("devices/disk[@device='disk']")
    if disk is None:
        raise SnapshotError("the saved domain has no disk")
    disk.find("source").set("file", path)  # type: ignore[union-attr]
    for backing in disk.findall("backingStore"):
        disk.remove(backing)
    return ET.tostring(root, encoding="unicode")


def frozen_chain(conn: libvirt.virConnect, path: str) -> tuple[str, ...]:
    """``<path>@<mtime>`` of ``path`` and of every backing file under it."""
    chain: list[str] = []
    while path:
        with _libvirt_errors(f"reading {path} (every layer of the frozen disk must be a volume)"):
            volume = ET.fromstring(conn.storageVolLookupByPath(path).XMLDesc(0))
        chain.append(f"{path}@{volume.findtext('target/timestamps/mtime', default='')}")
        path = volume.findtext("backingStore/path", default="")
    return tuple(chain)


def _delete_volume(pool: libvirt.virStoragePool, name: str) -> None:
    volume = virt.find_volume(pool, name)
    if volume is not None:
        with _libvirt_errors(f"deleting {name}"):
            volume.delete(0)


def _new_live_layer(pool: libvirt.virStoragePool, name: str, frozen_disk: str) -> str:
    """A fresh qcow2 ``name`` over ``frozen_disk`` (an older one of that name is deleted)."""
    _delete_volume(pool, name)
    with _libvirt_errors(f"reading {frozen_disk}"):
        capacity = pool.connect().storageVolLookupByPath(frozen_disk).info()[1]
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity)
    ET.SubElement(ET.SubElement(volume, "target"), "format", type="qcow2")
    backing = ET.SubElement(volume, "backingStore")
    ET.SubElement(backing, "path").text = frozen_disk
    ET.SubElement(backing, "format", type="qcow2")
    with _libvirt_errors(f"creating {name}"):
        return str(pool.createXML(ET.tostring(volume, encoding="unicode"), 0).path())


def _commit_live_layer(domain: libvirt.virDomain, target: str) -> None:
    """Merge the running top layer into the disk right under it (SHALLOW: without it libvirt
    commits into the bottom of the chain, the base image) and pivot the domain onto that."""
    flags = libvirt.VIR_DOMAIN_BLOCK_COMMIT_ACTIVE | libvirt.VIR_DOMAIN_BLOCK_COMMIT_SHALLOW
    with _libvirt_errors("committing the live layer into the frozen disk"):
        domain.blockCommit(target, None, None, 0, flags)
        deadline = time.monotonic() + _COMMIT_TIMEOUT_SECONDS
        while True:
            info = domain.blockJobInfo(target, 0)
            if info and info["end"] and info["cur"] == info["end"]:
                break
            if time.monotonic() > deadline:
                domain.blockJobAbort(target, 0)
                raise SnapshotError("committing the live layer did not finish in time")
            time.sleep(0.2)
        domain.blockJobAbort(target, libvirt.VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT)


def _names(lab: LabState) -> tuple[str, str]:
    return f"{lab.domain_name}-frozen.save", f"{lab.domain_name}-live.qcow2"


def save_frozen_state(lab: LabState) -> SavedState:
    """Freeze the running lab domain as it is now and leave it running on a fresh live layer.
    The state's ``freeze_manifest_sha256`` is left empty: the manifest describes the disk saved
    here, so it is known only after (the caller fills it in)."""
    conn = virt.connect(lab.libvirt_uri)
    domain = _lab_domain(conn, lab)
    if not domain.isActive():
        raise SnapshotError(f"lab domain {lab.domain_name} is not running: nothing to freeze")
    pool = _pool(conn, lab)
    image_name, live_name = _names(lab)
    memory_image = str(PurePosixPath(lab.pool_dir) / image_name)
    target, source = _disk_source(domain)
    if source != lab.overlay_path:
        _commit_live_layer(domain, target)
        if _disk_source(domain)[1] != lab.overlay_path:
            raise SnapshotError(f"after the commit the domain's disk is not {lab.overlay_path}")
    _delete_volume(pool, image_name)
    with _libvirt_errors(f"saving {lab.domain_name} to {memory_image}"):
        domain.save(memory_image)
        saved_xml = conn.saveImageGetXMLDesc(memory_image, libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE)
    pool.refresh(0)
    live_disk = _new_live_layer(pool, live_name, lab.overlay_path)
    restore_xml = with_disk(saved_xml, live_disk)
    with _libvirt_errors(f"restoring {lab.domain_name}"):
        conn.restoreFlags(memory_image, restore_xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
    return SavedState(
        lab=lab.lab,
        domain_name=lab.domain_name,
        freeze_manifest_sha256="",
        saved_at=datetime.now(UTC),
        memory_image=memory_image,
        frozen_disk=lab.overlay_path,
        frozen_chain=frozen_chain(conn, lab.overlay_path),
        live_disk=live_disk,
        restore_xml=restore_xml,
    )


class RestoreTimes(FrozenModel):
    destroy_seconds: float
    live_layer_seconds: float
    restore_seconds: float


def restore_frozen_state(lab: LabState, saved: SavedState) -> RestoreTimes:
    """Throw away everything since the freeze: the domain runs from the memory image again, on
    an empty live layer over the unchanged frozen disk."""
    conn = virt.connect(lab.libvirt_uri)
    domain = _lab_domain(conn, lab)
    pool = _pool(conn, lab)
    if frozen_chain(conn, saved.frozen_disk) != saved.frozen_chain:
        raise SnapshotError(
            f"the frozen disk {saved.frozen_disk} or a layer under it changed after the freeze "
            "(was the domain started from its own definition, or rebuilt?): run `runner freeze` "
            "again"
        )
    started = time.monotonic()
    if domain.isActive():
        with _libvirt_errors(f"stopping {lab.domain_name}"):
            domain.destroy()
    destroyed = time.monotonic()
    _new_live_layer(pool, PurePosixPath(saved.live_disk).name, saved.frozen_disk)
    layered = time.monotonic()
    with _libvirt_errors(f"restoring {lab.domain_name} from {saved.memory_image}"):
        conn.restoreFlags(saved.memory_image, saved.restore_xml, libvirt.VIR_DOMAIN_SAVE_RUNNING)
    restored = time.monotonic()
    return RestoreTimes(
        destroy_seconds=round(destroyed - started, 3),
        live_layer_seconds=round(layered - destroyed, 3),
        restore_seconds=round(restored - layered, 3),
    )
