"""Checks for cancel-async-tasks (standard library only; exits non-zero on the first failure).

Each scenario runs tests/driver.py in its own process. Timing is never judged, only the order
of events, so a slow (emulated) machine gives the same verdict as a fast one.
"""

import signal
import subprocess
import sys
from pathlib import Path

DRIVER = [sys.executable, str(Path(__file__).parent / "driver.py")]
DEADLINE = 120  # seconds; only a hang gets near it


def run_to_end(tasks: int, max_concurrent: int) -> list[str]:
    done = subprocess.run(
        [*DRIVER, "--tasks", str(tasks), "--max-concurrent", str(max_concurrent), "--work", "0.3"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert done.returncode == 0, f"run_tasks failed: {done.stderr.strip()[-500:]}"
    return done.stdout.splitlines()


def interrupt_after_starts(tasks: int, max_concurrent: int, starts: int) -> list[str]:
    """SIGINT once ``starts`` tasks have started; the tasks would otherwise work for minutes."""
    process = subprocess.Popen(
        [*DRIVER, "--tasks", str(tasks), "--max-concurrent", str(max_concurrent), "--work", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    events: list[str] = []
    try:
        while sum(event.startswith("start") for event in events) < starts:
            line = process.stdout.readline()
            assert line, f"the run ended after {events} before {starts} tasks started"
            events.append(line.strip())
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=DEADLINE)
    finally:
        process.kill()
    return events + rest.splitlines()


def runs_concurrently_within_the_limit() -> None:
    events = run_to_end(tasks=5, max_concurrent=2)
    assert events[-1] == "peak 2", f"expected 2 tasks at once, saw {events[-1]}"
    for i in range(5):
        assert f"done {i}" in events and f"cleanup {i}" in events, f"task {i} did not finish"


def cancels_started_tasks_with_cleanup() -> None:
    events = interrupt_after_starts(tasks=3, max_concurrent=2, starts=2)
    assert "start 2" not in events, "a queued task started after the interrupt"
    for i in (0, 1):
        assert f"cleanup {i}" in events, f"task {i}'s cleanup did not run: {events}"
    assert not any(event.startswith("done") for event in events), "a task was not cancelled"


def cancels_below_the_limit() -> None:
    events = interrupt_after_starts(tasks=2, max_concurrent=3, starts=2)
    for i in (0, 1):
        assert f"cleanup {i}" in events, f"task {i}'s cleanup did not run: {events}"


CHECKS = [
    runs_concurrently_within_the_limit,
    cancels_started_tasks_with_cleanup,
    cancels_below_the_limit,
]

if __name__ == "__main__":
    for check in CHECKS:
        try:
            check()
        except (AssertionError, subprocess.TimeoutExpired, OSError) as failure:
            print(f"FAIL {check.__name__}: {failure}")
            sys.exit(1)
        print(f"PASS {check.__name__}")
