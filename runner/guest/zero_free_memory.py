"""Runs INSIDE the guest just before the freeze is saved: drop the page cache and zero the free
memory, so QEMU writes those pages as zero-page records (a byte each, not 4 KiB) and a reset
reads a smaller memory image. Every cell then starts with a cold guest page cache: the same
for all of them.
"""

from __future__ import annotations

import mmap
import os

PAGE = mmap.PAGESIZE
MARGIN = 96 << 20  # left free so nothing in the guest is pushed to reclaim or the OOM killer


def free_bytes() -> int:
    with open("/proc/meminfo") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return int(fields["MemFree"].split()[0]) << 10


def main() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as handle:
        handle.write("3\n")
    size = (free_bytes() - MARGIN) // PAGE * PAGE
    if size <= 0:
        return
    # A populated private anonymous map is backed by freshly zeroed pages: the kernel zeroes
    # all the memory it takes from the free lists (in one call, not one fault per page), and
    # the free lists get it back, still zero, when the map is closed.
    mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE).close()


if __name__ == "__main__":
    main()
