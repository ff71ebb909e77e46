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
CHUNK = 64 << 20
MADV_POPULATE_WRITE = 23  # linux/mman.h (Linux 5.14); Python's mmap module may not name it


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
    # A private anonymous map, written to in chunks, is backed by freshly zeroed pages: the
    # kernel zeroes all the memory it takes from the free lists, and the free lists get it back,
    # still zero, when the map is closed. In chunks of 4 KiB pages (no huge pages: their
    # compaction holds a CPU for long under emulation), so that no single call keeps a vCPU in
    # the kernel long enough for its soft-lockup watchdog (20 s) to taint the kernel.
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.madvise(mmap.MADV_NOHUGEPAGE)
        for start in range(0, size, CHUNK):
            area.madvise(MADV_POPULATE_WRITE, start, min(CHUNK, size - start))
    finally:
        area.close()


if __name__ == "__main__":
    main()
