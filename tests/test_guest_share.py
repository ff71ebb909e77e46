"""The artifact store reaches the guest as a read-only virtio-9p share of the lab domain."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import PurePosixPath

import pytest

from deploy.domain_xml import render_domain
from runner.cache.paths import CachePaths
from runner.lab.layout import ARTIFACTS_MOUNT_TAG
from tests.support.domain_spec import SPEC
from tests.support.recorded_provisioning import example_plan, record_provisioning


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


def test_the_guest_mounts_the_domain_share_read_only_where_the_blobs_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = str(CachePaths.default().artifacts)  # what the lab shares (deploy.lab.domain_spec)
    share = ET.fromstring(render_domain(replace(SPEC, artifacts_dir=store)).xml).find(
        "devices/filesystem"
    )
    assert share is not None and share.find("source").get("dir") == store  # type: ignore[union-attr]
    tag = share.find("target").get("dir")  # type: ignore[union-attr]
    plan = example_plan()
    calls = record_provisioning(monkeypatch, plan)
    mounts = [kwargs for name, kwargs in calls if name == "server.mount"]
    assert len(mounts) == 1
    (mount,) = mounts
    assert (mount["device"], mount["fs_type"]) == (tag, "9p")
    assert "ro" in mount["options"] and "rw" not in mount["options"]
    assert "trans=virtio" in mount["options"]
    # fstab mounts the same share the same way at boot, and its line replaces any older one.
    (fstab,) = [kwargs for name, kwargs in calls if name == "files.line"]
    assert fstab["path"] == "/etc/fstab"
    device, path, fs_type, options, *_ = fstab["replace"].split()
    assert (device, path, fs_type) == (tag, mount["path"], "9p")
    assert set(mount["options"]) <= set(options.split(",")) and "rw" not in options.split(",")
    assert re.match(fstab["line"], fstab["replace"])
    # The mount point exists first, and every blob the guest unpacks is read through it.
    directories = [kwargs["path"] for name, kwargs in calls if name == "files.directory"]
    assert mount["path"] in directories
    assert [name for name, _ in calls].index("server.mount") < [name for name, _ in calls].index(
        "guest.unpacked"
    )
    blobs = [kwargs["blob"] for name, kwargs in calls if name == "guest.unpacked"]
    assert blobs and all(PurePosixPath(blob).is_relative_to(mount["path"]) for blob in blobs)
