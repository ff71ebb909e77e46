"""A STAND-IN FLEET HOST for the fast tier: a real ``runner fleet`` worker process (real
Temporal client, real proxy on loopback, real staging run directories) whose lab is a STAND-IN:
no VM; each cell's Harbor command runs as a short host process (``sleep``), its copy-back is a
passing trial tree, every audit passes (tests/support/fake_lab.py).

    python -m tests.support.standin_fleet_host --fleet F --host a --lock L --marks DIR

Each cell touches ``DIR/<host>-<n>`` when its stand-in Harbor starts (n counts the host's cells),
so a test knows when a host is in the middle of a cell. ``--fingerprint`` makes the stand-in
lab claim another environment (a host a fleet must refuse).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runner.core.roots import cache_root
from runner.fleet.host import HostWorker, serve_host
from runner.lab.transport import ExecResult
from runner.run.execute import LabIdentity, take_provider_keys
from runner.spec.fleet import load_fleet
from runner.spec.resolution import load_resolved_lock
from tests.support.fake_lab import FAKE_FREEZE, FakeLab
from tests.support.fake_transport import FakeTransport, Handler, answer, trial_tree


@dataclass
class StandinLab(FakeLab):
    """FakeLab with the identity a fleet asks of a host's lab."""

    name: str = "standin"
    fingerprint: str = ""

    def identity(self) -> LabIdentity:
        return LabIdentity(
            lab=self.name,
            environment_fingerprint=self.fingerprint,
            freeze_environment_fingerprint=self.fingerprint,
            freeze_manifest_sha256=FAKE_FREEZE,
            acceleration="none (a stand-in lab)",
        )


def harbor_as_host_process(host: str, marks: Path, seconds: float) -> Handler:
    counter = itertools.count(1)

    def handler(command: str) -> ExecResult:
        if "trial start" in command:
            (marks / f"{host}-{next(counter)}").touch()
            subprocess.run(["sleep", str(seconds)], check=True)
        return answer(command)

    return handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fleet", type=Path, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--marks", type=Path, required=True)
    parser.add_argument("--cell-seconds", type=float, default=2.0)
    parser.add_argument("--fingerprint")
    args = parser.parse_args()
    fleet = load_fleet(args.fleet)
    host = fleet.host(args.host)
    lock = load_resolved_lock(args.lock)
    trials = trial_tree(Path(tempfile.mkdtemp(prefix=f"standin-{host.name}-")), "pass")
    guest = FakeTransport(harbor_as_host_process(host.name, args.marks, args.cell_seconds), trials)
    fingerprint = args.fingerprint or lock.environment_fingerprint
    lab = StandinLab(guest, name=host.lab, fingerprint=fingerprint)
    worker = HostWorker(
        host=host,
        keys=take_provider_keys(lock),
        load_lab=lambda: lab,
        staging_root=cache_root() / "fleet" / host.name,
    )
    print(f"stand-in host {host.name} polling {host.queue}", flush=True)
    asyncio.run(serve_host(fleet, worker))


if __name__ == "__main__":
    main()
