"""The artifact store reaches the guest as a read-only virtio-9p share of the lab domain."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

from deploy.domain_xml import render_domain
from deploy.guest.provision import FSTAB_OPTIONS, MOUNT_OPTIONS
from runner.lab.layout import ARTIFACTS_MOUNT_TAG
from tests.support.domain_spec import SPEC


def test_the_store_is_shared_read_only_under_the_guest_mount_tag() -> None:
    root = ET.fromstring(render_domain(replace(SPEC, artifacts_dir="/cache/artifacts")).xml)
    (share,) = root.findall("devices/filesystem")
    assert (share.get("type"), share.get("accessmode")) == ("mount", "mapped")
    assert share.find("source").get("dir") == "/cache/artifacts"  # type: ignore[union-attr]
    assert share.find("target").get("dir") == ARTIFACTS_MOUNT_TAG  # type: ignore[union-attr]
    assert share.find("readonly") is not None


def test_no_store_no_share_and_the_share_is_part_of_the_spec_digest() -> None:
    assert ET.fromstring(render_domain(SPEC).xml).find("devices/filesystem") is None
    shared = replace(SPEC, artifacts_dir="/cache/artifacts")
    assert render_domain(shared).spec_digest != render_domain(SPEC).spec_digest


def test_the_guest_mounts_it_read_only() -> None:
    assert "ro" in MOUNT_OPTIONS
    assert "ro" in FSTAB_OPTIONS.split(",")
