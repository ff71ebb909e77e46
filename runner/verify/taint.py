"""A drift of the kernel's taint mask (``sysctl:kernel.tainted``) says its flags in words: a
guest whose kernel saw a soft lockup or warned since the freeze is named as such, not as a bare
number (runner.freeze.taint)."""

from __future__ import annotations

from runner.freeze.taint import TAINT_SYSCTL, taint_words
from runner.verify.report import Drift

TAINTED_CHECK = f"sysctl:{TAINT_SYSCTL}"


def explained(drift: Drift) -> Drift:
    """``drift`` with the taint masks it compares in words, when it is the taint's; else as is."""
    if drift.check != TAINTED_CHECK:
        return drift
    return Drift(
        check=drift.check, expected=taint_words(drift.expected), found=taint_words(drift.found)
    )
