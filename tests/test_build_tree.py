"""A killed image build's staging tree: its mounts come down before it is deleted, and only the
stagings of builds that are gone are swept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from images.build_tree import mounts_under, remove_build_tree
from images.paths import StorePaths

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_mounts_under_reads_escaped_paths_deepest_first(tmp_path: Path) -> None:
    tree = tmp_path / "a tree"
    mountinfo = tmp_path / "mountinfo"
    escaped = str(tree).replace(" ", "\\040")
    mountinfo.write_text(
        f"21 1 0:20 / {escaped}/rootfs/proc rw - proc proc rw\n"
        f"22 21 0:21 / {escaped}/rootfs/proc/sys/fs/binfmt_misc rw - binfmt_misc x rw\n"
        f"23 1 0:22 / {tmp_path}/a rw - tmpfs tmpfs rw\n"
        "24 1 0:23 / / rw - ext4 /dev/vda rw\n"
    )
    assert mounts_under(tree, mountinfo) == [
        tree / "rootfs/proc/sys/fs/binfmt_misc",
        tree / "rootfs/proc",
    ]


@needs_root
def test_a_tree_with_a_live_mount_is_unmounted_then_removed(tmp_path: Path) -> None:
    tree = tmp_path / ".staging-0123456789abcdef-1"
    shm = tree / "rootfs" / "dev" / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(shm)], check=True)
    (shm / "left-by-the-build").write_text("x")
    try:
        remove_build_tree(tree)
    finally:
        if mounts_under(shm):
            subprocess.run(["umount", "--lazy", str(shm)], check=False)
    assert not tree.exists()
    assert mounts_under(tmp_path) == []


def test_only_stagings_of_builds_that_are_gone_are_stale(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f".staging-0123456789abcdef-{gone.pid}"
    live = tmp_path / f".staging-fedcba9876543210-{os.getpid()}"
    unrelated = tmp_path / ".staging-notes"
    for path in (dead, live, unrelated):
        path.mkdir()
    assert StorePaths(tmp_path).stale_stagings() == [dead]
