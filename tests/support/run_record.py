"""One line per test run in ``~/.cache/frozen-bench/test-runs.jsonl``, and its tier table.

scripts/test.sh writes each tier's wall time to a TSV as the tier ends (``name<TAB>seconds``)
and calls this when it ends, passed or not, so anyone can see which commit passed which set:

    python3 -m tests.support.run_record TIERS_TSV --set ci|full --verdict passed|failed --wall S
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import Field

from runner.core.canonical import canonical_json
from runner.core.models import FrozenModel
from runner.core.roots import REPO_ROOT

RUNS_FILE = Path.home() / ".cache" / "frozen-bench" / "test-runs.jsonl"


class TestRun(FrozenModel):
    """One line of ``test-runs.jsonl``."""

    __test__ = False  # not a pytest test class

    commit: str
    set: Literal["ci", "full"]
    clean: bool = Field(description="the work tree was an unmodified checkout of the commit")
    tiers: dict[str, float]
    wall_s: float = Field(ge=0)
    verdict: Literal["passed", "failed"]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def read_tiers(path: Path) -> dict[str, float]:
    tiers: dict[str, float] = {}
    if path.exists():
        for row in path.read_text().splitlines():
            name, _, seconds = row.partition("\t")
            tiers[name] = tiers.get(name, 0.0) + float(seconds)
    return tiers


def table(run: TestRun) -> str:
    rows = [f"{name:<10} {seconds / 60:6.1f} min" for name, seconds in run.tiers.items()]
    rows.append(f"{'all':<10} {run.wall_s / 60:6.1f} min  ({run.set} set: {run.verdict})")
    return "\n".join(["tier       wall", *rows])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m tests.support.run_record")
    parser.add_argument("tiers", type=Path, help="the run's tier TSV")
    parser.add_argument("--set", dest="test_set", choices=("ci", "full"), required=True)
    parser.add_argument("--verdict", choices=("passed", "failed"), required=True)
    parser.add_argument("--wall", type=float, required=True)
    args = parser.parse_args()
    run = TestRun(
        commit=_git("rev-parse", "HEAD"),
        set=args.test_set,
        clean=_git("status", "--porcelain") == "",
        tiers=read_tiers(args.tiers),
        wall_s=round(args.wall, 1),
        verdict=args.verdict,
    )
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with RUNS_FILE.open("a") as handle:
        handle.write(canonical_json(run).decode() + "\n")
    print(table(run))
    print(f"(recorded in {RUNS_FILE})")


if __name__ == "__main__":
    main()
