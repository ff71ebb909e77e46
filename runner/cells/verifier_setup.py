"""Whether a verifier's own setup failed, so that its reward says nothing of the agent.

A task's ``tests/test.sh`` installs its tools before it judges (curl, uv, pytest); in the lab
they come from the frozen set (the base image, the lab's package mirror). When one does not,
the script still writes reward 0, which would read as the agent's failure. Two kinds of evidence
say otherwise: the lab's mirror was asked, during the verifier's run, for a package it does not
have (a miss in the mirror log); or the verifier's output shows a tool missing or a package
that could not be installed. Either makes the cell ``indeterminate`` (``verifier_setup``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runner.lab.harbor_result import HarborTrialResult
from runner.lab.mirror import MirrorRequest

# Lines of a verifier's output that only a failed setup writes: the shell not finding a tool or
# the env file uv's installer writes, uv failing to resolve or fetch, apt failing to install.
_SETUP_FAILED = re.compile(
    r"^(/tests/test\.sh: line \d+: .*(command not found|No such file or directory)"
    r"|\s*(error|\u00d7) (No solution found|Failed to (fetch|download|resolve))"  # uv's cross mark
    r"|\s*Because .* (was not found in the package registry|has no versions)"
    r"|E: (Unable to locate package|Package .* has no installation candidate))"
)
_OUTPUT_FILES = ("test-stdout.txt", "test-stderr.txt")


def verifier_setup_problem(
    trial_root: Path, result: HarborTrialResult | None, requests: tuple[MirrorRequest, ...]
) -> str | None:
    """What broke the verifier's setup (one line), or None when nothing shows it did."""
    if result is None or result.verifier is None or result.verifier.started_at is None:
        return None  # the verifier never ran: nothing of its setup to judge
    window = (result.verifier.started_at, result.verifier.finished_at)
    misses = sorted({r.item for r in requests if r.miss and _within(r.at, *window)})
    if misses:
        return f"the lab's mirror does not have {', '.join(misses)}"
    for name in _OUTPUT_FILES:
        for output in sorted(trial_root.rglob(f"verifier/{name}")):
            for line in output.read_text(errors="replace").splitlines():
                if _SETUP_FAILED.match(line):
                    return f"verifier output: {line.strip()[:200]}"
    return None


# The guest's clock is set from the host's at every reset (runner.freeze.reset): a little slack
# for the SSH round trip that set it.
_CLOCK_SLACK = timedelta(seconds=5)


def _within(at: str, started: datetime, finished: datetime | None) -> bool:
    moment = datetime.fromisoformat(at)
    if started.tzinfo is None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    after_start = moment >= started - _CLOCK_SLACK
    return after_start and (finished is None or moment <= finished + _CLOCK_SLACK)
