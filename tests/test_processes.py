"""Starting a server the tool runs (the lab's mirror, the recording mirror, Temporal's dev
server): returned once its port accepts connections, else one line naming it, and stopped."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from runner.core.errors import RunnerError
from runner.core.processes import start_listening, stop_process


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_server_is_returned_once_its_port_accepts_connections() -> None:
    port = free_port()
    # It listens only after a while: returned before that, the connection below is refused.
    code = (
        "import socket, time; time.sleep(1); "
        f"s = socket.create_server(('127.0.0.1', {port})); time.sleep(60)"
    )
    process = start_listening(python(code), port, "the stand-in", 30)
    try:
        socket.create_connection(("127.0.0.1", port), 5).close()
        assert process.poll() is None
    finally:
        stop_process(process, 5)


def test_a_server_that_exits_at_start_is_one_line_naming_it() -> None:
    with pytest.raises(RunnerError, match=r"^the stand-in exited at start \(3\)$"):
        start_listening(python("raise SystemExit(3)"), free_port(), "the stand-in", 30)


def test_a_server_that_never_listens_is_stopped_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def keep(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    monkeypatch.setattr(subprocess, "Popen", keep)
    port = free_port()
    with pytest.raises(RunnerError, match=rf"^the stand-in did not listen on 127.0.0.1:{port} "):
        start_listening(python("import time; time.sleep(60)"), port, "the stand-in", 1)
    assert [process.returncode is not None for process in started] == [True]
