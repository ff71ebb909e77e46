"""The restore XML: the saved domain with its disk moved onto the live layer."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from runner.lab.snapshot import with_disk

SAVED = """<domain type='qemu'><name>frozen-bench-x</name><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
<source file='/pool/frozen-bench-x.qcow2' index='1'/>
<backingStore type='file' index='2'><format type='qcow2'/><source file='/pool/base.qcow2'/>
<backingStore/></backingStore><target dev='vda' bus='virtio'/></disk>
<serial type='file'><source path='/pool/console.log'/></serial>
</devices></domain>"""


def test_disk_moves_to_the_live_layer_and_the_stale_chain_is_dropped() -> None:
    root = ET.fromstring(with_disk(SAVED, "/pool/frozen-bench-x-live.qcow2"))
    disk = root.find("devices/disk")
    assert disk is not None
    assert disk.find("source").get("file") == "/pool/frozen-bench-x-live.qcow2"  # type: ignore[union-attr]
    assert disk.find("backingStore") is None  # libvirt probes the chain of the live layer
    assert root.find("devices/serial/source").get("path") == "/pool/console.log"  # type: ignore[union-attr]
    assert root.findtext("name") == "frozen-bench-x"
