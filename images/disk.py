"""Stage 4: the ext4 root filesystem (mke2fs -d) in a qcow2, natively and reproducibly.

mke2fs copies each file's mtime, atime and ctime from the host tree. mtimes are clamped to
SOURCE_DATE_EPOCH first; atime and ctime cannot be set on the host (reading a file moves its
atime, ctime is the moment of the last change), so debugfs sets both to SOURCE_DATE_EPOCH in the
new filesystem afterwards. The UUID and the directory-hash seed derive from the input hash.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from images.buildlog import BuildLog
from runner.core.errors import RunnerError

_DEBUGFS_ECHO = re.compile(r"^debugfs( [0-9.]+ \(|: set_inode_field )")
_NAMESPACE = uuid.UUID("6f0c1e0a-5b1f-4c55-9a43-0f3d1c2b7a10")


def filesystem_ids(input_hash: str) -> tuple[str, str]:
    """(filesystem UUID, htree hash seed): fixed for a given image, different between images."""
    return (
        str(uuid.uuid5(_NAMESPACE, f"{input_hash}:uuid")),
        str(uuid.uuid5(_NAMESPACE, f"{input_hash}:hash_seed")),
    )


def tree_paths(rootfs: Path) -> list[str]:
    """Every path in the tree, as the filesystem will name it ("/" first), sorted."""
    paths = ["/"]
    for directory, dirnames, filenames in os.walk(rootfs):
        base = "/" + Path(directory).relative_to(rootfs).as_posix().removeprefix(".")
        for name in dirnames + filenames:
            paths.append(base.rstrip("/") + "/" + name)
    return sorted(paths)


def clamp_mtimes(rootfs: Path, epoch: int) -> int:
    """Set every mtime later than epoch to epoch (symlinks themselves too); return how many."""
    clamped = 0
    for path in tree_paths(rootfs):
        target = rootfs / path.lstrip("/") if path != "/" else rootfs
        info = target.lstat()
        if info.st_mtime > epoch:
            os.utime(target, (epoch, epoch), follow_symlinks=False)
            clamped += 1
    return clamped


def _debugfs_time_commands(paths: list[str], epoch: int) -> str:
    lines: list[str] = []
    for path in paths:
        if '"' in path or "\n" in path:
            raise RunnerError(f"images: cannot quote {path!r} for debugfs")
        for field in ("atime", "ctime"):
            lines.append(f'set_inode_field "{path}" {field} @{epoch}')
    return "\n".join(lines) + "\n"


def make_filesystem(
    rootfs: Path,
    raw: Path,
    *,
    size_gib: int,
    label: str,
    input_hash: str,
    epoch: int,
    log: BuildLog,
) -> None:
    log.stage("filesystem", f"ext4 '{label}', {size_gib} GiB (sparse), clamped to {epoch}")
    log.note(f"clamped mtimes: {clamp_mtimes(rootfs, epoch)}")
    fs_uuid, hash_seed = filesystem_ids(input_hash)
    fake_time = {"E2FSPROGS_FAKE_TIME": str(epoch)}
    log.run(
        [
            "mke2fs", "-q", "-F", "-t", "ext4", "-L", label, "-U", fs_uuid,
            "-E", f"hash_seed={hash_seed},root_owner=0:0",
            "-d", str(rootfs), str(raw), f"{size_gib}G",
        ],
        env=fake_time,
    )  # fmt: skip
    commands = raw.with_suffix(".debugfs")
    commands.write_text(_debugfs_time_commands(tree_paths(rootfs), epoch))
    # debugfs exits 0 even when a command fails: anything but its banner and echoes is an error.
    problems = log.run(
        ["debugfs", "-w", "-f", str(commands), str(raw)], env=fake_time, omit=_DEBUGFS_ECHO
    )
    if problems:
        raise RunnerError(f"images: debugfs could not set times: {problems[0]}")
    commands.unlink()
    log.run(["e2fsck", "-f", "-n", str(raw)], env=fake_time)


def convert_to_qcow2(raw: Path, qcow2: Path, log: BuildLog) -> None:
    log.stage("qcow2", qcow2.name)
    log.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)])
