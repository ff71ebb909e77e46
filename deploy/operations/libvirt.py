"""Operations on the hypervisor's libvirt: the lab's storage pool, volumes and domain.

Each reads libvirt facts and yields work only for what differs; the work runs at execute time on
the controller, through libvirt-python over ``host.data.libvirt_uri``. What would destroy guest
data (replacing an overlay) is refused here and left to ``runner rebuild``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import libvirt
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from deploy.domain_xml import DomainDefinition
from deploy.errors import ControllerCommand
from deploy.facts.libvirt import Domain, StoragePool, StorageVolume, get_libvirt_fact
from runner.lab import libvirt as virt

Commands = Generator[ControllerCommand, None, None]
_RUNNING = frozenset({"running", "blocked"})


def _on_controller(function: Callable[..., None], *args: Any) -> ControllerCommand:
    return ControllerCommand(function, args, {})


def _pool_xml(name: str, path: str) -> str:
    pool = ET.Element("pool", type="dir")
    ET.SubElement(pool, "name").text = name
    ET.SubElement(ET.SubElement(pool, "target"), "path").text = path
    return ET.tostring(pool, encoding="unicode")


def _volume_xml(name: str, capacity: int, volume_format: str, backing_path: str = "") -> str:
    volume = ET.Element("volume")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity)
    ET.SubElement(volume, "allocation", unit="bytes").text = "0"
    ET.SubElement(ET.SubElement(volume, "target"), "format", type=volume_format)
    if backing_path:
        backing = ET.SubElement(volume, "backingStore")
        ET.SubElement(backing, "path").text = backing_path
        ET.SubElement(backing, "format", type="qcow2")
    return ET.tostring(volume, encoding="unicode")


def _create_pool(uri: str, name: str, path: str) -> None:
    pool = virt.connect(uri).storagePoolDefineXML(_pool_xml(name, path), 0)
    pool.build(0)
    pool.create(0)
    pool.setAutostart(1)


def _start_pool(uri: str, name: str) -> None:
    virt.connect(uri).storagePoolLookupByName(name).create(0)


@operation()
def dir_pool(pool: str, path: str) -> Commands:
    """
    A libvirt dir pool at ``path``, defined, built, started and autostarted.

    + pool: pool name
    + path: the pool's directory on the hypervisor
    """
    info = get_libvirt_fact(host, StoragePool, pool=pool)
    if info["state"] != "absent" and info["path"] != path:
        raise OperationError(
            f"pool {pool} exists at {info['path']}, not at {path}: another checkout's lab of"
            " this name (deploy with another LAB, or remove that one with `runner teardown`)"
        )
    if info["state"] == "absent":
        yield _on_controller(_create_pool, host.data.libvirt_uri, pool, path)
    elif info["state"] == "inactive":
        yield _on_controller(_start_pool, host.data.libvirt_uri, pool)
    else:
        host.noop(f"pool {pool} already active at {path}")


def _delete_volume(pool: libvirt.virStoragePool, name: str) -> None:
    volume = virt.find_volume(pool, name)
    if volume is not None:
        volume.delete(0)


def _upload_volume(uri: str, pool_name: str, name: str, source: str) -> None:
    conn = virt.connect(uri)
    pool = conn.storagePoolLookupByName(pool_name)
    _delete_volume(pool, name)  # a partial upload of an earlier run
    size = Path(source).stat().st_size
    # Declared raw: libvirt only allocates the file; a dir pool probes the real format later.
    volume = pool.createXML(_volume_xml(name, size, "raw"), 0)
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, size, 0)
        with open(source, "rb") as handle:
            stream.sendAll(lambda _stream, nbytes, file: file.read(nbytes), handle)
        stream.finish()
    except BaseException:
        stream.abort()
        volume.delete(0)
        raise
    pool.refresh(0)


@operation()
def uploaded_volume(pool: str, volume: str, source: str) -> Commands:
    """
    A copy of the controller's file ``source`` as ``volume`` of ``pool``.

    The volume name carries the content digest, so a present volume of the full size is this
    content (an interrupted upload is deleted, or replaced on the next run).

    + pool: pool name
    + volume: volume name
    + source: file on the controller
    """
    size = Path(source).stat().st_size
    info = get_libvirt_fact(host, StorageVolume, pool=pool, volume=volume)
    if info["state"] == "present" and info["physical"] == size:
        host.noop(f"volume {volume} already uploaded ({size} bytes)")
        return
    yield _on_controller(_upload_volume, host.data.libvirt_uri, pool, volume, source)


def _create_overlay(uri: str, pool_name: str, name: str, backing_path: str, capacity: int) -> None:
    pool = virt.connect(uri).storagePoolLookupByName(pool_name)
    pool.createXML(_volume_xml(name, capacity, "qcow2", backing_path), 0)


@operation()
def overlay_volume(pool: str, volume: str, backing_path: str, capacity: int) -> Commands:
    """
    A qcow2 overlay volume over ``backing_path``; an overlay over anything else is an error
    (replacing it would lose the guest's disk: that is ``runner rebuild``'s job).

    + pool: pool name
    + volume: volume name
    + backing_path: path of the qcow2 backing file on the hypervisor
    + capacity: virtual size in bytes
    """
    info = get_libvirt_fact(host, StorageVolume, pool=pool, volume=volume)
    if info["state"] == "absent":
        yield _on_controller(
            _create_overlay, host.data.libvirt_uri, pool, volume, backing_path, capacity
        )
    elif (info["backing_path"], info["capacity"]) != (backing_path, capacity):
        raise OperationError(
            f"overlay {volume} is backed by {info['backing_path'] or 'nothing'} "
            f"({info['capacity']} bytes), not {backing_path} ({capacity} bytes): "
            "run `runner rebuild` to replace it"
        )
    else:
        host.noop(f"overlay {volume} already backed by {backing_path}")


def _define(uri: str, xml: str) -> None:
    virt.connect(uri).defineXML(xml)


def _start(uri: str, name: str) -> None:
    virt.connect(uri).lookupByName(name).create()


def _resume(uri: str, name: str) -> None:
    virt.connect(uri).lookupByName(name).resume()


def _restart(uri: str, name: str) -> None:
    domain = virt.connect(uri).lookupByName(name)
    domain.destroy()
    domain.create()


@operation()
def domain(definition: DomainDefinition) -> Commands:
    """
    A lab domain defined from ``definition`` and running it.

    A domain of that name without our lab tag is never touched.

    + definition: the rendered domain (name, XML, digest of the spec)
    """
    uri = host.data.libvirt_uri
    name = definition.name
    info = get_libvirt_fact(host, Domain, domain=name)
    if info["state"] != "absent" and not info["ours"]:
        raise OperationError(f"domain {name} exists but is not a lab domain: not touching it")
    if info["defined_spec"] != definition.spec_digest:
        yield _on_controller(_define, uri, definition.xml)

    runs_spec = info["running_spec"] == definition.spec_digest
    if info["state"] in _RUNNING and runs_spec:
        if info["defined_spec"] == definition.spec_digest:
            host.noop(f"domain {name} already defined and running as specified")
    elif info["state"] == "paused" and runs_spec:
        yield _on_controller(_resume, uri, name)
    elif info["running_spec"]:
        yield _on_controller(_restart, uri, name)
    else:
        yield _on_controller(_start, uri, name)
