"""A lock run on one lab, then on a fleet of two labs (one batch per host), in one sitting; then
the fleet run again with one host's worker killed (SIGKILL) in the middle of a cell.

1. Labs: ``pyinfra -y inventory/fleet.py deploy.py`` and ``runner freeze --lab`` for each of
   the fleet's hosts (``--skip-deploy``: they are deployed and frozen already).
2. A Temporal server on the fleet's loopback port (``temporal server start-dev``), and one
   ``runner fleet worker`` per host, each holding the (made-up, scripted-provider) key.
3. ``runner execute LOCK --lab <first host's lab>``: the single-lab run, strictly serial.
4. ``runner execute LOCK --fleet FLEET``: the same lock, its batches on the hosts at once.
5. The fleet run again; ``--kill-after`` seconds into the last host's first cell its worker is
   killed: its batch must finish on the other host, every cell counted once.

Prints each run's wall time, receipt status and which host ran which cells. Not a pass/fail
test: the figures are what this machine measured (two TCG guests share its two cores here).

    python bench/fleet.py [--fleet fleets/local.toml] [--lock locks/demo-fleet.toml]
                          [--skip-deploy] [--kill-after 60]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from runner.core.roots import REPO_ROOT, cache_root
from runner.fleet.server import dev_server
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.spec.fleet import Fleet, load_fleet

RUNNER = str(Path(sys.executable).parent / "runner")


def run(command: list[str], environment: dict[str, str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=REPO_ROOT, env=environment, check=True)


def deploy_and_freeze(
    fleet_path: Path, fleet: Fleet, lock: Path, environment: dict[str, str]
) -> None:
    deploy = {**environment, "FLEET": str(fleet_path), "LOCK": str(lock)}
    run(
        [str(Path(sys.executable).parent / "pyinfra"), "-y", "inventory/fleet.py", "deploy.py"],
        deploy,
    )
    for host in fleet.hosts:
        run([RUNNER, "freeze", "--lab", host.lab], environment)


def start_workers(
    fleet_path: Path, fleet: Fleet, lock: Path, environment: dict[str, str], logs: Path
) -> dict[str, subprocess.Popen[bytes]]:
    workers = {}
    for host in fleet.hosts:
        command = [RUNNER, "fleet", "worker", "--fleet", str(fleet_path), "--host", host.name]
        log = (logs / f"worker-{host.name}.log").open("ab")
        workers[host.name] = subprocess.Popen(
            [*command, "--lock", str(lock)], cwd=REPO_ROOT, env=environment, stdout=log, stderr=log
        )
    return workers


def stop_workers(workers: dict[str, subprocess.Popen[bytes]]) -> None:
    for worker in workers.values():
        worker.kill()
        worker.wait()


def summary(name: str, run_dir: Path, wall: float) -> dict[str, object]:
    paths = RunPaths(run_dir)
    receipt = json.loads(paths.receipt.read_text())
    lines = Ledger(paths).lines()
    interrupted = [
        f"{record.cell_id} attempt {record.attempt}: {record.failure.message}"
        for line in lines
        for record in Ledger(paths).attempts(line.cell_id)
        if record.status == "interrupted" and record.failure is not None
    ]
    return {
        "run": name,
        "wall_seconds": round(wall, 1),
        "status": receipt["status"],
        "cells": len(lines),
        "cells_by_host": dict(Counter(line.host or "one lab" for line in lines)),
        "placement": (receipt.get("placement") or {}).get("held"),
        "interrupted": interrupted,
        "credential_scan": receipt["credential_scan"],
        "run_dir": str(run_dir),
    }


def timed_execute(command: list[str], environment: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(command, cwd=REPO_ROOT, env=environment, check=False)
    return time.monotonic() - started


def killed_mid_cell(
    command: list[str],
    environment: dict[str, str],
    victim: subprocess.Popen[bytes],
    staging: Path,
    run_dir: Path,
    kill_after: float,
) -> float:
    """The controller runs ``run_dir``; once the victim host's staging (``<run>-<suffix>``, the
    run's fleet id) shows a cell begun, ``kill_after`` seconds later the victim's worker is
    killed."""
    started = time.monotonic()
    controller = subprocess.Popen(command, cwd=REPO_ROOT, env=environment)
    while not any(staging.glob(f"{run_dir.name}-*/*/attempt-*/attempts/*/attempt-*.json")):
        if controller.poll() is not None:
            sys.exit("the controller ended before the victim host began a cell")
        time.sleep(1)
    time.sleep(kill_after)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    print(f"killed the worker {kill_after:g} s into its first cell", flush=True)
    controller.wait()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, default=Path("fleets/local.toml"))
    parser.add_argument("--lock", type=Path, default=Path("locks/demo-fleet.toml"))
    parser.add_argument("--skip-deploy", action="store_true")
    parser.add_argument("--kill-after", type=float, default=60.0)
    args = parser.parse_args()
    fleet = load_fleet(args.fleet)
    # The scripted provider's key, made up for the bench and held by every worker and the
    # controller (whose credential scan looks for it); never in a Temporal payload.
    environment = {**os.environ, "SCRIPTED_PROVIDER_KEY": secrets.token_urlsafe(32)}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = REPO_ROOT / "runs" / f"bench-fleet-{stamp}"
    out.mkdir(parents=True)
    if not args.skip_deploy:
        deploy_and_freeze(args.fleet, fleet, args.lock, environment)
    port = int(fleet.temporal.rsplit(":", 1)[1])
    results = []
    with ExitStack() as stack:
        stack.enter_context(dev_server(port, out / "temporal.sqlite", out / "temporal.log"))
        workers = start_workers(args.fleet, fleet, args.lock, environment, out)
        stack.callback(stop_workers, workers)
        single = out / "single"
        command = [RUNNER, "execute", str(args.lock), "--run-dir", str(single)]
        wall = timed_execute([*command, "--lab", fleet.hosts[0].lab], environment)
        results.append(summary("one lab, serial", single, wall))
        spread = out / "fleet"
        command = [RUNNER, "execute", str(args.lock), "--run-dir", str(spread), "--fleet"]
        wall = timed_execute([*command, str(args.fleet)], environment)
        results.append(summary("fleet, batch per host", spread, wall))
        killed = out / "fleet-killed"
        victim = fleet.hosts[-1]
        staging = cache_root() / "fleet" / victim.name
        command = [RUNNER, "execute", str(args.lock), "--run-dir", str(killed), "--fleet"]
        wall = killed_mid_cell(
            [*command, str(args.fleet)],
            environment,
            workers[victim.name],
            staging,
            killed,
            args.kill_after,
        )
        results.append(summary(f"fleet, host {victim.name} killed mid-cell", killed, wall))
    (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    for result in results:
        print(json.dumps(result))
    print(f"figures: {out / 'bench.json'}")


if __name__ == "__main__":
    main()
