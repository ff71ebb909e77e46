"""``runner reset``: return the lab's guest to its frozen state and wait until SSH answers.

"Answers" is the guest's sshd sending its banner through QEMU's port forward (QEMU accepts the
TCP connection itself even while the guest is not running; the banner comes from the guest).
After a restore the guest's clock reads the time of the freeze; it is then set to the host's
time over an SSH session (there is no guest agent), so timings and timestamps taken in the guest
stay true. Under TCG the SSH handshake alone takes seconds, so that step is timed on its own.
"""

from __future__ import annotations

import time

from runner.core.models import FrozenModel
from runner.freeze.record import load_freeze
from runner.lab.snapshot import RestoreTimes, restore_frozen_state
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport, wait_for_sshd

SSH_WAIT_SECONDS = 60.0


class ResetTimes(FrozenModel):
    freeze_manifest_sha256: str
    restore: RestoreTimes
    banner_seconds: float  # from the restore until the guest's sshd sent its banner
    clock_seconds: float  # the SSH session that set the guest's clock
    answering_seconds: float  # the reset proper: stop, restore, banner
    total_seconds: float


def set_guest_clock(guest: GuestTransport) -> None:
    guest.check(f"date -u -s @{time.time():.3f} >/dev/null", timeout=30)


def reset_lab(lab_name: str, guest: GuestTransport | None = None) -> ResetTimes:
    """Restore the freeze and set the guest's clock. ``guest``: the caller's transport (its
    session died with the restore), reconnected and used for the clock, so a cell pays one SSH
    handshake, not two."""
    lab = load_lab_state(LabPaths.for_lab(lab_name))
    manifest, saved = load_freeze(lab_name)
    started = time.monotonic()
    restore = restore_frozen_state(lab, saved)
    restored = time.monotonic()
    wait_for_sshd(lab, SSH_WAIT_SECONDS)
    answered = time.monotonic()
    if guest is None:
        with SshTransport.for_lab(lab).connect(SSH_WAIT_SECONDS) as own:
            set_guest_clock(own)
    else:
        guest.close()
        set_guest_clock(guest.connect(SSH_WAIT_SECONDS))
    done = time.monotonic()
    return ResetTimes(
        freeze_manifest_sha256=manifest.sha256,
        restore=restore,
        banner_seconds=round(answered - restored, 3),
        clock_seconds=round(done - answered, 3),
        answering_seconds=round(answered - started, 3),
        total_seconds=round(done - started, 3),
    )
