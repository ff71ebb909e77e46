"""A lab disk's root filesystem mounted read-only on the host, to be read at native speed.

Reading tens of thousands of files inside the emulated guest is slow (the guest's own tools run
at TCG speed); the host reads the same bytes from the qcow2 chain::

    <scratch>/disk.raw     qemu-storage-daemon's read-only FUSE export of the chain
    /dev/loopN             that export as a read-only block device
    <scratch>/root/        its ext4 mounted read-only (noload, nodev, nosuid, noexec)

Every layer is opened read-only without taking QEMU's image locks (``force-share``): the live
layer is written by QEMU while the guest runs, so ``quiesced_copy`` has the guest sync and freeze
its root filesystem (``fsfreeze``: the journal is flushed and marked clean, QEMU has flushed the
qcow2 metadata) just while the host copies that layer, and the copy is read. A filesystem that
still needs its journal replayed is refused (``noload`` would show it without its last
transactions).

FUSE carries the filesystem's metadata; file contents are read past it: ``DiskMap`` knows from
``qemu-img map`` where each block of the guest's disk lies in which qcow2 file, and the
filesystem's own extent map (``FIEMAP``) says which blocks hold a file, so a file is read with
``pread`` from the layers (through the host's page cache, at native speed). A file whose extents
are not plain (inline data, unknown or encoded extents) is read through the mount instead.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.processes import stop_process
from runner.lab.transport import GuestTransport

_EXPORT_WAIT_SECONDS = 30.0
_RELEASE_SECONDS = 30.0
_TOOL_SECONDS = 120.0
# How long the guest's root filesystem may stay frozen if the host never lets go of it.
_FROZEN_SECONDS_AT_MOST = 300
_FROZEN = b"frozen-for-the-host"
_READ = 1 << 20
REQUIRED_TOOLS = ("qemu-img", "qemu-storage-daemon", "losetup", "mount", "umount", "dumpe2fs")

# linux/fiemap.h
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_HEADER = struct.Struct("=QQIII4x")  # fm_start, fm_length, fm_flags, mapped, count
_FIEMAP_EXTENT = struct.Struct("=QQQ16xI12x")  # fe_logical, fe_physical, fe_length, fe_flags
_EXTENTS_PER_CALL = 256
_EXTENT_LAST = 0x1
_EXTENT_UNWRITTEN = 0x800
# UNKNOWN, DELALLOC, ENCODED, DATA_ENCRYPTED, NOT_ALIGNED, DATA_INLINE, DATA_TAIL
_EXTENT_NOT_PLAIN = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400


class DiskError(RunnerError):
    """A lab disk could not be mounted or read on the host."""


def _run(*command: str) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TOOL_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DiskError(f"{command[0]}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise DiskError(f"{' '.join(command[:2])} failed ({done.returncode}): {last}")
    return done.stdout


@dataclass(frozen=True)
class _Range:
    start: int
    length: int
    file: int | None  # index into the chain; None: reads as zeros
    offset: int


class DiskMap:
    """Where each byte of the guest's disk lies: in which layer of the chain, at which offset."""

    def __init__(self, layer: Path) -> None:
        info = ("qemu-img", "info", "-U", "--backing-chain", "--output=json", str(layer))
        chain = json.loads(_run(*info))
        if any(image.get("format") != "qcow2" for image in chain[:-1]):
            raise DiskError(f"{layer}: every layer above the base must be qcow2")
        self.files = [os.open(image["filename"], os.O_RDONLY) for image in chain]
        self.formats = [str(image.get("format")) for image in chain]
        mapped = json.loads(_run("qemu-img", "map", "-U", "--output=json", str(layer)))
        self.ranges = [self._range(entry) for entry in mapped]
        self.starts = [r.start for r in self.ranges]

    def _range(self, entry: dict[str, object]) -> _Range:
        start, length = int(str(entry["start"])), int(str(entry["length"]))
        if not entry.get("data") or entry.get("zero"):
            return _Range(start, length, None, 0)
        if entry.get("compressed") or "offset" not in entry:
            raise DiskError("the lab disk has compressed clusters: cannot be read past QEMU")
        return _Range(start, length, int(str(entry["depth"])), int(str(entry["offset"])))

    def close(self) -> None:
        for fd in self.files:
            os.close(fd)

    def read(self, physical: int, length: int) -> Iterator[bytes]:
        """The guest disk's bytes ``[physical, physical + length)``, in pieces."""
        index = bisect.bisect_right(self.starts, physical) - 1
        while length > 0:
            if index < 0 or index >= len(self.ranges):
                raise DiskError(f"byte {physical} is outside the lab disk")
            span = self.ranges[index]
            skip = physical - span.start
            take = min(length, span.length - skip, _READ)
            if span.file is None:
                yield bytes(take)
            else:
                data = os.pread(self.files[span.file], take, span.offset + skip)
                if len(data) != take:
                    raise DiskError("a layer of the lab disk is shorter than its map says")
                yield data
            physical, length = physical + take, length - take
            if skip + take == span.length:
                index += 1


def _extents(fd: int) -> Iterator[tuple[int, int, int, int]]:
    """(logical, physical, length, flags) of each extent of an open file, in logical order."""
    start = 0
    while True:
        request = _FIEMAP_HEADER.pack(start, 2**64 - 1 - start, 0, 0, _EXTENTS_PER_CALL)
        buffer = bytearray(request + bytes(_FIEMAP_EXTENT.size * _EXTENTS_PER_CALL))
        fcntl.ioctl(fd, _FS_IOC_FIEMAP, buffer)
        mapped = _FIEMAP_HEADER.unpack_from(buffer)[3]
        if mapped == 0:
            return
        extent = (0, 0, 0, 0)
        for i in range(mapped):
            extent = _FIEMAP_EXTENT.unpack_from(buffer, _FIEMAP_HEADER.size + i * 56)
            yield extent
        logical, _, length, flags = extent
        if flags & _EXTENT_LAST:
            return
        start = logical + length


@dataclass(frozen=True)
class MountedDisk:
    """A mounted lab disk: its root, and file contents read past the mount."""

    root: Path
    map: DiskMap

    def chunks(self, path: str, size: int) -> Iterator[bytes]:
        """The content of the file at host ``path`` (``size`` bytes, as lstat said)."""
        with open(path, "rb", buffering=0) as handle:
            extents = list(_extents(handle.fileno()))
            if any(flags & _EXTENT_NOT_PLAIN for *_, flags in extents):
                while chunk := handle.read(_READ):
                    yield chunk
                return
        position = 0
        for logical, physical, length, flags in extents:
            if logical >= size:
                break
            if logical > position:  # a hole
                yield from _zeros(logical - position)
            length = min(length, size - logical)
            if flags & _EXTENT_UNWRITTEN:
                yield from _zeros(length)
            else:
                yield from self.map.read(physical, length)
            position = logical + length
        yield from _zeros(size - position)


def _zeros(count: int) -> Iterator[bytes]:
    while count > 0:
        take = min(count, _READ)
        yield bytes(take)
        count -= take


def _blockdev(layer: Path) -> str:
    return json.dumps(
        {
            "driver": "qcow2",
            "node-name": "disk",
            "read-only": True,
            "force-share": True,
            "file": {"driver": "file", "filename": str(layer), "locking": "off"},
        }
    )


def _wait_for_export(daemon: subprocess.Popen[bytes], export: Path) -> None:
    deadline = time.monotonic() + _EXPORT_WAIT_SECONDS
    while export.stat().st_size == 0:
        if daemon.poll() is not None:
            message = daemon.stderr.read().decode(errors="replace") if daemon.stderr else ""
            last = (message.strip().splitlines() or ["no message"])[-1]
            raise DiskError(f"qemu-storage-daemon exited ({daemon.returncode}): {last}")
        if time.monotonic() > deadline:
            raise DiskError(f"qemu-storage-daemon did not export {export} in time")
        time.sleep(0.05)


@contextmanager
def _exported(export: Path, layer: Path) -> Iterator[None]:
    export.touch()
    daemon = subprocess.Popen(
        [
            "qemu-storage-daemon",
            "--blockdev",
            _blockdev(layer),
            "--export",
            f"type=fuse,id=disk,node-name=disk,mountpoint={export},writable=off",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for_export(daemon, export)
        yield
    finally:
        stop_process(daemon, 30)
        if daemon.stderr:
            daemon.stderr.close()
        # A daemon that had to be killed leaves its FUSE mount behind (every access then fails
        # with ENOTCONN), and the scratch directory under it could not be removed.
        if _is_mount_point(export):
            _run("umount", "--lazy", str(export))


def _is_mount_point(path: Path) -> bool:
    """From the mount table, not ``stat``: a dead FUSE mount cannot be stat'ed."""
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return any(line.split()[4] == _mount_table_form(path) for line in table)


def _mount_table_form(path: Path) -> str:
    return str(path).translate(
        {ord("\\"): "\\134", ord(" "): "\\040", ord("\t"): "\\011", ord("\n"): "\\012"}
    )


def _backing_file(device: str) -> Path:
    return Path("/sys/block") / Path(device).name / "loop" / "backing_file"


def _still_backed_by(device: str, image: Path) -> bool:
    """Whether ``device`` is still bound to ``image`` (another process may have bound the freed
    device to its own file by now: that is no longer ours to wait for)."""
    try:
        return _backing_file(device).read_text().strip() == str(image)
    except OSError:
        return False


def _wait_until_released(device: str, image: Path) -> None:
    """The kernel may let go of a detached loop device's backing file after ``losetup`` has
    returned; until it has, the FUSE export under it is busy. Waited for a bounded time only:
    an export still held then is unmounted lazily once its daemon is gone (``_exported``)."""
    deadline = time.monotonic() + _RELEASE_SECONDS
    while _still_backed_by(device, image) and time.monotonic() < deadline:
        time.sleep(0.05)


@contextmanager
def _loop_device(image: Path) -> Iterator[str]:
    device = _run("losetup", "--read-only", "--find", "--show", str(image)).strip()
    try:
        yield device
    finally:
        _run("losetup", "--detach", device)
        _wait_until_released(device, image)


def _require_clean(device: str) -> None:
    header = _run("dumpe2fs", "-h", device).splitlines()
    features = next((line for line in header if line.startswith("Filesystem features:")), "")
    if "needs_recovery" in features.split():
        raise DiskError("the lab disk's filesystem was not quiesced (its journal needs replaying)")


@contextmanager
def _mounted(device: str, root: Path) -> Iterator[None]:
    root.mkdir()
    _run("mount", "-t", "ext4", "-o", "ro,noload,nodev,nosuid,noexec", device, str(root))
    try:
        yield
    finally:
        _run("umount", str(root))


def missing_tools() -> tuple[str, ...]:
    return tuple(tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None)


@contextmanager
def mounted_disk(layer: Path) -> Iterator[MountedDisk]:
    """The root filesystem of the qcow2 chain whose top is ``layer``, read-only until the
    context ends; nothing of the chain is written. Its filesystem must be clean."""
    if missing := missing_tools():
        raise DiskError(f"reading a lab disk on the host needs {', '.join(missing)}")
    if not layer.is_file():
        raise DiskError(f"no disk layer {layer} on this machine")
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lab-disk-")))
        export = scratch / "disk.raw"
        stack.enter_context(_exported(export, layer))
        device = stack.enter_context(_loop_device(export))
        _require_clean(device)
        stack.enter_context(_mounted(device, scratch / "root"))
        disk_map = DiskMap(layer)
        stack.callback(disk_map.close)
        yield MountedDisk(scratch / "root", disk_map)


@contextmanager
def quiesced_copy(guest: GuestTransport, layer: Path) -> Iterator[Path]:
    """A copy of the running guest's live ``layer`` as it was with the guest's root filesystem
    synced and frozen, made on the host; the guest thaws as soon as the copy is whole (or on its
    own after a bounded wait if the host never comes back), so the host reads the copy while the
    guest runs on. The layer holds only what the guest wrote since its freeze or reset (tens to
    hundreds of MB), so the guest stays frozen for about a second where a read through it took
    tens of seconds. Its backing chain is the live layer's own (absolute paths, never written).
    The copy lives in the temporary directory (``TMPDIR``) until the context ends."""
    hold = (
        f"sync && fsfreeze --freeze / && echo {_FROZEN.decode()} || exit 1; "
        f"read -r -t {_FROZEN_SECONDS_AT_MOST} _; fsfreeze --unfreeze /"
    )
    with tempfile.TemporaryDirectory(prefix="lab-layer-") as scratch:
        copy = Path(scratch) / layer.name
        with guest.holding(hold, _FROZEN, wait_seconds=120):
            shutil.copyfile(layer, copy)
        yield copy


@contextmanager
def quiesced_disk(guest: GuestTransport, layer: Path) -> Iterator[MountedDisk]:
    """The running guest's root filesystem as it was at one moment, read on the host from a copy
    of its live ``layer`` (``quiesced_copy``) while the guest runs on."""
    with quiesced_copy(guest, layer) as copy, mounted_disk(copy) as disk:
        yield disk
