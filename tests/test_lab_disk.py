"""A lab disk read on the host (runner.lab.disk) with the real tools: a small ext4 in a qcow2
chain is exported by qemu-storage-daemon, looped, mounted read-only and let go of again, each
time leaving no mount, no loop device and no scratch directory behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from runner.lab import disk as lab_disk
from runner.lab.disk import mounted_disk

CONTENT = b"written before the qcow2 was made\n"


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root (CI runs as root)")
    work = tmp_path_factory.mktemp("disk")
    tree = work / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "note").write_bytes(CONTENT)
    raw = work / "root.raw"
    subprocess.run(["truncate", "-s", "64M", str(raw)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-d", str(tree), str(raw)], check=True)
    base = work / "base.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(base)], check=True)
    top = work / "top.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(top)],
        check=True,
    )
    return top


def loop_devices_of(path: Path) -> list[str]:
    listing = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "BACK-FILE"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in listing.split() if line.startswith(str(path))]


def test_a_disk_mounted_and_let_go_of_again_and_again_leaves_nothing_behind(layer: Path) -> None:
    scratches = []
    for _ in range(8):
        with mounted_disk(layer) as disk:
            assert (disk.root / "etc" / "note").read_bytes() == CONTENT
            scratch = disk.root.parent
            scratches.append(scratch)
            assert loop_devices_of(scratch)
        assert not scratch.exists()
        assert not loop_devices_of(scratch)
        assert str(scratch) not in Path("/proc/self/mountinfo").read_text()
    assert len(set(scratches)) == 8


def test_an_export_whose_daemon_died_is_unmounted_and_its_scratch_removed(layer: Path) -> None:
    with mounted_disk(layer) as disk:
        scratch = disk.root.parent
        export = scratch / "disk.raw"
        subprocess.run(["pkill", "-KILL", "-f", f"mountpoint={export}"], check=True)
    assert not scratch.exists()
    assert str(scratch) not in Path("/proc/self/mountinfo").read_text()
    assert not loop_devices_of(scratch)


def test_a_freed_loop_device_bound_again_by_another_reader_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two labs read their disks at once: the device this read freed may already back the other
    lab's export (the e2e's failure: 30 s waited on a device that was no longer ours)."""
    backing = tmp_path / "backing_file"
    monkeypatch.setattr(lab_disk, "_backing_file", lambda device: backing)
    monkeypatch.setattr(lab_disk, "_RELEASE_SECONDS", 0.3)
    backing.write_text("/tmp/lab-disk-other/disk.raw\n")
    started = time.monotonic()
    lab_disk._wait_until_released("/dev/loop0", Path("/tmp/lab-disk-mine/disk.raw"))
    assert time.monotonic() - started < 0.1
    backing.write_text("/tmp/lab-disk-mine/disk.raw\n")  # still ours: waited, bounded, no error
    lab_disk._wait_until_released("/dev/loop0", Path("/tmp/lab-disk-mine/disk.raw"))
    assert time.monotonic() - started >= 0.3
