"""The warm Harbor process's protocol on the host (runner/guest/warm_harbor.py), with the lock's
Harbor in its host venv: the cell's command finds the process waiting and hands it the cell;
Harbor's exit code comes back through the FIFO; once served, the same command starts Harbor
cold. (tests/test_warm_harbor_vm.py: the same in the frozen guest, with resets.)

The host venv is pip-installed from PyPI (tests/support/harbor_venv.py): the tests that run
Harbor are ``registry`` tests (scripts/test.sh full)."""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from runner.core.roots import REPO_ROOT
from runner.guest.warm_harbor import (
    HARBOR_LAUNCHED_AT,
    HARBOR_PROCESS,
    REQUEST_FIFO,
    UNIT,
    WarmRequest,
    launch_command,
)


def test_the_freeze_scope_watches_the_warm_process() -> None:
    scope = tomllib.loads(resources.files("runner").joinpath("freeze/scope.toml").read_text())
    assert scope["waiting_units"] == {UNIT: str(REQUEST_FIFO)}


@pytest.fixture
def warm_process(harbor_python: Path) -> Iterator[subprocess.Popen[bytes]]:
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [str(harbor_python), "-m", "runner.guest.warm_harbor"]
    process = subprocess.Popen(command, env=environment, start_new_session=True)
    started = time.monotonic()
    while not os.path.exists(REQUEST_FIFO):
        assert process.poll() is None, "the warm process ended before it waited"
        assert time.monotonic() - started < 120, "the warm process did not wait in 120 s"
        time.sleep(0.1)
    yield process
    process.kill()
    process.wait()


def _launch(tmp_path: Path, harbor_python: Path, *argv: str) -> tuple[int, str, str, str]:
    """Run the cell's launch command; (exit code, warm or cold, Harbor's log, pgid file)."""
    request = WarmRequest(
        argv=argv,
        environment={"BENCH_WARM_TEST": "1"},
        log=str(tmp_path / "harbor.log"),
        pgid_file=str(tmp_path / "pgid"),
    )
    harbor = str(harbor_python.parent / "harbor")
    command = launch_command(request, harbor)
    code = subprocess.run(["bash", "-c", command], timeout=120).returncode
    assert float((tmp_path / HARBOR_LAUNCHED_AT).read_text()) <= time.time()
    said = (tmp_path / HARBOR_PROCESS).read_text().strip()
    return code, said, (tmp_path / "harbor.log").read_text(), (tmp_path / "pgid").read_text()


@pytest.mark.registry
def test_a_cell_is_served_by_the_waiting_process_then_cold(
    warm_process: subprocess.Popen[bytes], harbor_python: Path, tmp_path: Path
) -> None:
    code, said, log, pgid = _launch(tmp_path, harbor_python, "--version")
    assert (code, said, log.strip()) == (0, "warm", "0.20.0")
    assert int(pgid) == warm_process.pid  # its own process group: what the deadline kills
    assert warm_process.wait(timeout=30) == 0
    assert not os.path.lexists(REQUEST_FIFO)
    code, said, log, pgid = _launch(tmp_path, harbor_python, "--version")
    assert (code, said, log.strip()) == (0, "cold", "0.20.0")
    assert int(pgid) != warm_process.pid


@pytest.mark.registry
def test_harbors_exit_code_comes_back_from_the_warm_process(
    warm_process: subprocess.Popen[bytes], harbor_python: Path, tmp_path: Path
) -> None:
    code, said, log, _ = _launch(tmp_path, harbor_python, "trial", "start", "--no-such-option")
    assert (code, said) == (2, "warm")  # Harbor's (typer's) usage error
    assert "No such option" in log
