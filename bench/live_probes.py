"""What each live-state probe of the audit costs in a lab's guest (runner.freeze.live): every
probe run alone, ``--repeats`` times, then all of them at once as the audit runs them; the
median seconds of each, slowest first. Nothing here is a pass/fail speed test; the numbers are
what was measured on this machine (under TCG the guest's own process start-up is most of it).

    python -m bench.live_probes --lab NAME [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from runner.freeze.live import LIVE_PROBES, concurrent_command, frame_nonce
from runner.freeze.manifest import default_scope
from runner.freeze.record import GUEST_WAIT_SECONDS
from runner.lab.state import LabPaths, load_lab_state
from runner.lab.transport import GuestTransport, SshTransport

_TIMEOUT_SECONDS = 300


def _seconds(guest: GuestTransport, command: str) -> float:
    started = time.monotonic()
    guest.check(f"set -o pipefail; {command} > /dev/null", timeout=_TIMEOUT_SECONDS)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lab = load_lab_state(LabPaths.for_lab(args.lab))
    scope = default_scope()
    commands = {probe.category: probe.command(scope) for probe in LIVE_PROBES}
    with SshTransport.for_lab(lab).connect(GUEST_WAIT_SECONDS) as guest:
        medians = {
            name: statistics.median(_seconds(guest, command) for _ in range(args.repeats))
            for name, command in commands.items()
        }
        together = statistics.median(
            _seconds(guest, concurrent_command(commands, frame_nonce()))
            for _ in range(args.repeats)
        )
    for name, seconds in sorted(medians.items(), key=lambda item: -item[1]):
        print(f"{name:<12} {seconds:6.2f} s")
    print(f"{'(sum)':<12} {sum(medians.values()):6.2f} s")
    print(f"{'(at once)':<12} {together:6.2f} s")


if __name__ == "__main__":
    main()
