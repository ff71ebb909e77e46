"""The kernel's taint mask (``/proc/sys/kernel/tainted``) in words: the flags and their letters
are the kernel's (Documentation/admin-guide/tainted-kernels.rst). A soft lockup (L) in a guest
under emulation is most often its vCPUs starved by a loaded host; a warning (W) or an oops (D)
is the kernel's own complaint."""

from __future__ import annotations

# The mask's sysctl name (the sysctl category's key for it) and its file in the guest.
TAINT_SYSCTL = "kernel.tainted"
TAINT_FILE = "/proc/sys/" + TAINT_SYSCTL.replace(".", "/")

TAINT_FLAGS: tuple[tuple[str, str], ...] = (
    ("P", "a proprietary module was loaded"),
    ("F", "a module was force-loaded"),
    ("S", "an SMP-unsafe configuration"),
    ("R", "a module was force-unloaded"),
    ("M", "a machine check"),
    ("B", "a bad page"),
    ("U", "tainted on request from user space"),
    ("D", "the kernel died recently (an oops or BUG)"),
    ("A", "an ACPI table was overridden"),
    ("W", "the kernel issued a warning"),
    ("C", "a staging driver was loaded"),
    ("I", "a platform firmware bug was worked around"),
    ("O", "an out-of-tree module was loaded"),
    ("E", "an unsigned module was loaded"),
    ("L", "a soft lockup: a CPU was stuck (or starved by the host) for over 20 s"),
    ("K", "the kernel was live-patched"),
    ("X", "an auxiliary taint"),
    ("T", "built with the struct randomisation plugin"),
    ("N", "an in-kernel test was run"),
)


def taint_words(mask: str) -> str:
    """``mask`` with its flags in words: ``16384 (L: a soft lockup: ...)``; as it is when it is
    not a number."""
    try:
        value = int(mask)
    except ValueError:
        return mask
    flags = [
        f"{letter}: {words}" for bit, (letter, words) in enumerate(TAINT_FLAGS) if value >> bit & 1
    ]
    unknown = value >> len(TAINT_FLAGS)
    if unknown:
        flags.append(f"bits above {len(TAINT_FLAGS) - 1}: {unknown << len(TAINT_FLAGS)}")
    return f"{mask} ({'; '.join(flags)})" if flags else mask
