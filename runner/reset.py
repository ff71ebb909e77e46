"""``runner reset``: return the lab's guest to its frozen state and wait until SSH answers.

After a restore the guest's clock reads the time of the freeze; it is set to the host's time
over SSH (there is no guest agent), so timings and timestamps taken in the guest stay true.
"""

from __future__ import annotations

import time

from runner.freeze import guest_transport, load_freeze
from runner.lab import LabPaths, load_lab_state
from runner.lock import FrozenModel
from runner.snapshot import RestoreTimes, restore_frozen_state

SSH_WAIT_SECONDS = 60.0


class ResetTimes(FrozenModel):
    freeze_manifest_sha256: str
    restore: RestoreTimes
    ssh_seconds: float  # from the restore until a command ran in the guest (clock set)
    total_seconds: float


def reset_lab(lab_name: str) -> ResetTimes:
    lab = load_lab_state(LabPaths.for_lab(lab_name))
    manifest, saved = load_freeze(lab_name)
    started = time.monotonic()
    restore = restore_frozen_state(lab, saved)
    restored = time.monotonic()
    with guest_transport(lab).connect(SSH_WAIT_SECONDS) as guest:
        guest.check(f"date -u -s @{time.time():.3f} >/dev/null", timeout=30)
    done = time.monotonic()
    return ResetTimes(
        freeze_manifest_sha256=manifest.sha256,
        restore=restore,
        ssh_seconds=round(done - restored, 3),
        total_seconds=round(done - started, 3),
    )
