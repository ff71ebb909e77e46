"""Removing a build's tree that a killed mmdebstrap may have left with /proc, /sys, /dev/pts and
/dev/shm still mounted inside it.

A plain recursive delete of such a tree walks into the live mounts: it fails on /proc and /sys
and empties whatever tmpfs is mounted there. So the mounts at or under the tree are taken down
first, deepest first, and the delete refuses to run while any is still there.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from runner.core.errors import RunnerError

MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a path as octal escapes."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode()


def mounts_under(tree: Path, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """Mount points at or under ``tree``, deepest first."""
    root = tree.resolve()
    points = [Path(_unescape(line.split(" ")[4])) for line in mountinfo.read_text().splitlines()]
    inside = {point for point in points if point == root or root in point.parents}
    return sorted(inside, key=lambda point: len(point.parts), reverse=True)


def remove_build_tree(tree: Path) -> None:
    """Unmount whatever is mounted in ``tree``, then delete it; a mount that stays is an error."""
    if not tree.exists():
        return
    for point in mounts_under(tree):
        done = subprocess.run(["umount", "--lazy", str(point)], capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RunnerError(f"cannot remove {tree}: {point} is mounted and umount said: {said}")
    shutil.rmtree(tree)
