"""Frozen-state audit and reset of a frozen lab, against a reboot: how long each takes.

1. ``runner verify``'s audit (ansible-runner, check mode) of the frozen guest: must pass.
2. ``--resets`` resets: stop, restore, sshd banner, clock set (the reset target is <= 3 s to
   SSH answering).
3. One reboot of the guest (``systemctl reboot``) until its sshd answers and until an SSH
   session runs a command, for comparison; then a reset puts the lab back to its freeze.
4. Re-provisioning with nothing to change is the guest provisioning's to measure: give its
   command with ``--reprovision CMD`` (run through the shell, timed; its exit must be 0).
5. A last audit, which must pass again after the reboot and the reset.

The lab must have been frozen (``runner freeze``). Nothing here is a pass/fail speed test; the
numbers printed are what was measured on this machine.

    python bench/verify_reset.py [--lab NAME] [--resets 5] [--no-reboot] [--reprovision CMD]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from runner.freeze.reset import reset_lab
from runner.lab.state import LabPaths, LabState, lab_name_from_env, load_lab_state
from runner.lab.transport import GuestError, SshTransport, wait_for_sshd
from runner.verify.audit import audit_lab, render_drifts

REBOOT_WAIT_SECONDS = 1800.0  # a reboot under TCG on a busy 2-core host took over 600 s


def timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def audit_seconds(lab: LabState, evidence: Path) -> float:
    report = audit_lab(lab, evidence)
    if not report.passed:
        sys.exit(f"audit found drift:\n{render_drifts(report)}")
    print(f"verify: {len(report.checks)} checks, passed, {report.seconds:.1f} s")
    return report.seconds


def sshd_gone(lab: LabState) -> None:
    """Until the sshd of the guest that is shutting down stops answering."""
    deadline = time.monotonic() + REBOOT_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            wait_for_sshd(lab, 0)
        except GuestError:
            return
        time.sleep(0.2)
    sys.exit("the guest never went down after `systemctl reboot`")


def reboot_seconds(lab: LabState) -> tuple[float, float]:
    """(until the sshd banner, until an SSH session ran a command) after ``systemctl reboot``."""
    with SshTransport.for_lab(lab).connect(60) as guest:
        started = time.monotonic()
        guest.exec("systemctl reboot", timeout=10)
    sshd_gone(lab)
    wait_for_sshd(lab, REBOOT_WAIT_SECONDS)
    banner = time.monotonic() - started
    with SshTransport.for_lab(lab).connect(REBOOT_WAIT_SECONDS) as guest:
        guest.check("true", timeout=60)
    return banner, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default=lab_name_from_env())
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--no-reboot", action="store_true")
    parser.add_argument(
        "--reprovision", metavar="CMD", help="the guest provisioning's no-change run, timed"
    )
    args = parser.parse_args()
    lab = load_lab_state(LabPaths.for_lab(args.lab))
    with tempfile.TemporaryDirectory(prefix="verify-reset-") as scratch:
        evidence = Path(scratch)
        verify_first = audit_seconds(lab, evidence)
        resets = [reset_lab(args.lab) for _ in range(args.resets)]
        for number, reset in enumerate(resets, 1):
            r = reset.restore
            print(
                f"reset {number}: stop {r.destroy_seconds:.2f} + layer "
                f"{r.live_layer_seconds:.2f} + restore {r.restore_seconds:.2f} + banner "
                f"{reset.banner_seconds:.2f} = {reset.answering_seconds:.2f} s answering; "
                f"clock set {reset.clock_seconds:.2f} s"
            )
        answering = [reset.answering_seconds for reset in resets]
        if not args.no_reboot:
            banner, session = reboot_seconds(lab)
            print(f"reboot: sshd banner after {banner:.1f} s, SSH command after {session:.1f} s")
            reset_lab(args.lab)
        if args.reprovision:
            seconds = timed(lambda: subprocess.run(args.reprovision, shell=True, check=True))
            print(f"re-provision with nothing to change: {seconds:.1f} s")
            reset_lab(args.lab)
        verify_last = audit_seconds(lab, evidence)
    print(
        f"SUMMARY verify {statistics.median([verify_first, verify_last]):.1f} s (median of 2); "
        f"reset to SSH answering median {statistics.median(answering):.2f} s "
        f"(min {min(answering):.2f}, max {max(answering):.2f}, n={len(answering)})"
        + ("" if args.no_reboot else f"; reboot to sshd banner {banner:.1f} s")
    )


if __name__ == "__main__":
    main()
