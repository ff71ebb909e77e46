"""A fleet run against a real Temporal server (``temporal server start-dev`` on loopback): real
``runner execute --fleet`` controllers and real worker processes, each standing for a host, whose
labs are STAND-INS (tests/support/standin_fleet_host.py: no VM, each cell's Harbor is a short
host process). One host is killed with SIGKILL in the middle of a cell: its batch finishes on
the other, the ledger has every cell once, the lost attempt is kept as interrupted evidence, and
neither a second controller nor a second execute of the same run counts anything twice."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.fleet.server import dev_server
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule

LOCK = REPO_ROOT / "locks" / "demo-fleet.toml"
RUNNER = Path(sys.executable).parent / "runner"
KEY = "scripted-key-" + secrets.token_urlsafe(24)  # what every process must keep out of history


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def temporal(tmp_path: Path) -> Iterator[str]:
    with dev_server(free_port(), tmp_path / "temporal.sqlite", tmp_path / "temporal.log") as at:
        yield at


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "FROZEN_BENCH_CACHE": str(tmp_path / "cache"),
        "SCRIPTED_PROVIDER_KEY": KEY,
    }


def fleet_file(tmp_path: Path, temporal: str) -> Path:
    path = tmp_path / "fleet.toml"
    hosts = "".join(f'[[hosts]]\nname = "{n}"\nlab = "standin-{n}"\n' for n in ("a", "b"))
    path.write_text(f'temporal = "{temporal}"\n{hosts}')
    return path


class Hosts:
    """The stand-in hosts' worker processes."""

    def __init__(self, tmp_path: Path, fleet: Path, environment: dict[str, str]) -> None:
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        self.fleet, self.environment, self.logs = fleet, environment, tmp_path
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> None:
        command = [sys.executable, "-m", "tests.support.standin_fleet_host", "--fleet"]
        command += [str(self.fleet), "--host", name, "--lock", str(LOCK)]
        command += ["--marks", str(self.marks), "--cell-seconds", "3", *extra]
        log = (self.logs / f"host-{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            command, cwd=REPO_ROOT, env=self.environment, stdout=log, stderr=log
        )

    def wait_for_mark(self, mark: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not (self.marks / mark).exists():
            assert time.monotonic() < deadline, f"no cell started on {mark}"
            for name, process in self.processes.items():
                assert process.poll() is None, f"host {name} exited {process.returncode}"
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()


@pytest.fixture
def hosts(tmp_path: Path, temporal: str, environment: dict[str, str]) -> Iterator[Hosts]:
    running = Hosts(tmp_path, fleet_file(tmp_path, temporal), environment)
    yield running
    running.stop()


def controller(hosts: Hosts, run_dir: Path, *lock: str) -> subprocess.Popen[str]:
    command = [str(RUNNER), "execute", *lock, "--run-dir", str(run_dir), "--fleet"]
    return subprocess.Popen(
        [*command, str(hosts.fleet)],
        cwd=REPO_ROOT,
        env=hosts.environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(process: subprocess.Popen[str], seconds: float = 180) -> tuple[int, str]:
    output, _ = process.communicate(timeout=seconds)
    return process.returncode, output


def test_a_killed_host_s_batch_finishes_on_the_other_and_counts_every_cell_once(
    tmp_path: Path, hosts: Hosts
):
    hosts.start("a")
    hosts.start("b")
    run_dir = tmp_path / "run"
    first = controller(hosts, run_dir, str(LOCK))
    hosts.wait_for_mark("a-1")  # host a is inside its first cell's Harbor (a 3 s sleep)
    hosts.kill("a")  # at once: a second controller takes longer than that cell to start
    second = controller(hosts, run_dir)  # the first one waits out a's heartbeat meanwhile
    code, said = finished(second, 60)
    assert code == 2 and "another controller is executing this run" in said, said
    code, said = finished(first)
    assert code == 0, said

    paths = RunPaths(run_dir)
    lines = Ledger(paths).lines()
    schedule = read_model(paths.schedule, Schedule)
    assert sorted(line.cell_id for line in lines) == sorted(cell.id for cell in schedule.cells)
    lost = [
        record
        for line in lines
        for record in Ledger(paths).attempts(line.cell_id)
        if record.status == "interrupted"
    ]
    assert len(lost) == 1, lost
    (record,) = lost
    assert record.failure is not None and record.failure.exception_type == "HostLost"
    assert "host a" in record.failure.message and "heartbeat" in record.failure.message
    again = next(line for line in lines if line.cell_id == record.cell_id)
    assert again.attempt == 2 and again.host == "b"
    assert {line.host for line in lines} == {"b"}  # a never finished a cell
    assert (paths.attempts_dir / record.cell_id / "attempt-2.json").is_file()

    receipt = json.loads(paths.receipt.read_text())
    assert receipt["status"] == "completed", receipt["reasons"]
    assert receipt["final_verify"] == "passed"
    assert receipt["placement"] == {
        "allowed": "batch-per-host",
        "held": "batch-per-host",
        "hosts_by_batch": {"reference": ["b"], "wrong": ["b"]},
    }
    assert "placement | batch-per-host: reference on b; wrong on b" in paths.report_md.read_text()
    histories = sorted((paths.fleet_dir / "history").glob("*.json"))
    assert len(histories) == 1 + len(schedule.batches)  # the hosts' check, one per batch
    scan = json.loads(paths.scan.read_text())
    assert scan["clean"] and scan["secrets_checked"]["provider_key"] == 1
    texts = [history.read_text() for history in histories]
    assert all(KEY not in text for text in texts)
    # Payloads decoded: the cells' requests and results are there to read (and to scan).
    assert any(f'"cell_id": "{record.cell_id}"' in text for text in texts)

    ledger_bytes = paths.ledger.read_bytes()
    hosts.start("a")  # back: a second execute of the finished run attaches, counts nothing
    code, said = finished(controller(hosts, run_dir))
    assert code == 0, said
    assert paths.ledger.read_bytes() == ledger_bytes


def test_a_controller_killed_mid_run_is_replaced_by_one_that_attaches(tmp_path: Path, hosts: Hosts):
    hosts.start("a")
    hosts.start("b")
    run_dir = tmp_path / "run"
    first = controller(hosts, run_dir, str(LOCK))
    hosts.wait_for_mark("a-1")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    code, said = finished(controller(hosts, run_dir))  # the workflows waited for their ledger
    assert code == 0, said
    paths = RunPaths(run_dir)
    lines = Ledger(paths).lines()
    assert len(lines) == 4 and all(line.attempt == 1 for line in lines)
    assert {line.host for line in lines} == {"a", "b"}
    assert json.loads(paths.receipt.read_text())["status"] == "completed"


def test_a_host_frozen_for_another_environment_is_refused_by_name(tmp_path: Path, hosts: Hosts):
    hosts.start("a")
    hosts.start("b", "--fingerprint", "sha256:" + "1" * 64)
    run_dir = tmp_path / "run"
    code, said = finished(controller(hosts, run_dir, str(LOCK)))
    assert code == 2, said
    assert "host b (lab standin-b) was provisioned for environment sha256:111" in said
    assert not RunPaths(run_dir).ledger.exists()
    assert json.loads(RunPaths(run_dir).receipt.read_text())["status"] == "failed_closed"


def test_a_serial_lock_is_refused_a_fleet(tmp_path: Path, hosts: Hosts):
    run_dir = tmp_path / "run"
    code, said = finished(controller(hosts, run_dir, str(REPO_ROOT / "locks" / "demo.toml")))
    assert code == 2, said
    assert "placement is serial, so its batches run on one lab" in said
