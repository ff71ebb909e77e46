"""Fault injection on a frozen lab (#24): one run stopped at several points, each time resumed,
must end ``completed`` with every cell in its ledger once, and its archive must check intact.

Each fault is ``SIGNAL@TRIGGER+SECONDS`` and is dealt to the ``runner execute`` that the
previous resume started (the first to the run's start):

- ``cell``: SECONDS after the next attempt of a cell starts (its attempt record appears);
- ``lineN``: SECONDS after the run's ledger holds N lines;
- SIGNAL is ``kill`` (SIGKILL: nothing of the runner's own handling runs) or ``term`` (SIGTERM:
  the runner's clean stop, exit 143).

The defaults are #24's: SIGKILL 60 s into the first cell, SIGTERM 150 s into the next, SIGKILL 3 s
after the ledger's fourth line. A fault whose run ends before its trigger is reported, not
dealt; a last resume then runs the run to its end. Nothing here is a pass/fail test: it prints
what each stop and resume gave and exits 1 when the run did not end as it must.

    python -m bench.fault_injection --lab demo [--lock locks/demo.toml] [--run-dir DIR]
        [--fault kill@cell+60 --fault term@cell+150 --fault kill@line4+3]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule

RUNNER = [sys.executable, "-c", "from runner.cli.main import main; main()"]
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}
DEFAULT_FAULTS = ("kill@cell+60", "term@cell+150", "kill@line4+3")
TRIGGER_LIMIT_SECONDS = 3600.0  # a cell has a 900-1800 s deadline; a trigger waits past one


@dataclass(frozen=True)
class Fault:
    spec: str
    signal: signal.Signals
    ledger_lines: int | None  # None: the next attempt's start
    seconds: float


def parse_fault(spec: str) -> Fault:
    try:
        name, rest = spec.split("@", 1)
        trigger, seconds = rest.split("+", 1)
        lines = None if trigger == "cell" else int(trigger.removeprefix("line"))
        if trigger not in ("cell", f"line{lines}"):
            raise ValueError(trigger)
        return Fault(spec, SIGNALS[name], lines, float(seconds))
    except (KeyError, ValueError) as error:
        raise argparse.ArgumentTypeError(
            f"{spec!r} is not SIGNAL@TRIGGER+SECONDS (kill|term, cell|lineN): {error}"
        ) from None


def attempts_started(paths: RunPaths) -> int:
    return len(list(paths.attempts_dir.glob("*/attempt-*.json")))


def ledger_lines(paths: RunPaths) -> int:
    return len(Ledger(paths).lines()) if paths.ledger.exists() else 0


def wait_for_trigger(paths: RunPaths, runner: subprocess.Popen[bytes], fault: Fault) -> bool:
    """Until ``fault``'s trigger, then its seconds; False when the runner ended first."""
    attempts_before = attempts_started(paths)
    deadline = time.monotonic() + TRIGGER_LIMIT_SECONDS
    while runner.poll() is None and time.monotonic() < deadline:
        if fault.ledger_lines is None:
            reached = attempts_started(paths) > attempts_before
        else:
            reached = ledger_lines(paths) >= fault.ledger_lines
        if reached:
            stop = time.monotonic() + fault.seconds
            while runner.poll() is None and time.monotonic() < stop:
                time.sleep(0.2)  # the fault's delay, ended early if the runner ends
            return runner.poll() is None
        time.sleep(0.5)  # polling the run dir's files for the trigger
    return False


def start(lock: Path | None, run_dir: Path, lab: str) -> subprocess.Popen[bytes]:
    first = [str(lock)] if lock is not None else []
    command = [*RUNNER, "execute", *first, "--run-dir", str(run_dir), "--lab", lab]
    return subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def run_with_faults(lock: Path, run_dir: Path, lab: str, faults: list[Fault]) -> int:
    paths = RunPaths(run_dir)
    started = time.monotonic()
    runner = start(lock, run_dir, lab)
    for fault in faults:
        if not wait_for_trigger(paths, runner, fault):
            print(f"{fault.spec}: not dealt, the run ended first (exit {runner.wait()})")
            break
        runner.send_signal(fault.signal)
        code = runner.wait()
        print(
            f"{fault.spec}: dealt at {time.monotonic() - started:.0f} s, exit {code}, "
            f"ledger {ledger_lines(paths)} lines, {attempts_started(paths)} attempts"
        )
        runner = start(None, run_dir, lab)
    code = runner.wait()
    print(f"last resume: exit {code} at {time.monotonic() - started:.0f} s")
    return code


def checked_archive(run_dir: Path) -> tuple[int, str]:
    archive = run_dir.with_name(run_dir.name + ".tar.gz")
    made = subprocess.run(
        [*RUNNER, "archive", str(run_dir), "--out", str(archive)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        return made.returncode, (made.stderr or made.stdout).strip().splitlines()[-1]
    key = RunPaths(run_dir).receipt_public_key
    checked = subprocess.run(
        [*RUNNER, "check-archive", str(archive), "--key", str(key)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return checked.returncode, (checked.stdout + checked.stderr).strip().splitlines()[-1]


def judged(run_dir: Path) -> list[str]:
    """What the run's end must be and is not; empty when it ended as it must."""
    paths = RunPaths(run_dir)
    scheduled = {cell.id for cell in read_model(paths.schedule, Schedule).cells}
    lines = Ledger(paths).lines()
    for line in lines:
        print(f"  {line.cell_id}: attempt {line.attempt}, {line.outcome} ({line.reason})")
    wrong = []
    recorded = [line.cell_id for line in lines]
    if sorted(recorded) != sorted(scheduled):
        wrong.append(f"the ledger holds {len(recorded)} lines for {len(scheduled)} cells")
    receipt = json.loads(paths.receipt.read_text()) if paths.receipt.exists() else {}
    status = receipt.get("status", "absent")
    print(f"receipt: {status} {receipt.get('reasons', [])}")
    if status != "completed":
        wrong.append(f"the receipt is {status}")
    code, verdict = checked_archive(run_dir)
    print(f"archive: {verdict} (exit {code})")
    if code != 0:
        wrong.append("the archive is not intact")
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument("--lock", type=Path, default=REPO_ROOT / "locks" / "demo.toml")
    parser.add_argument("--run-dir", type=Path, default=Path("/tmp/fault-injection-run"))
    parser.add_argument("--fault", type=parse_fault, action="append", dest="faults")
    args = parser.parse_args()
    if args.run_dir.exists():
        parser.error(f"{args.run_dir} exists: give a new --run-dir")
    faults = args.faults or [parse_fault(spec) for spec in DEFAULT_FAULTS]
    code = run_with_faults(args.lock, args.run_dir, args.lab, faults)
    wrong = judged(args.run_dir) + ([f"the last resume exited {code}"] if code else [])
    print("ended as it must" if not wrong else "NOT as it must: " + "; ".join(wrong))
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
