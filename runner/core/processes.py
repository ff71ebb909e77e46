"""Child processes the tool starts (a server, a daemon): started and waited for until they
listen, and stopped: asked first, then made."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import IO, Any

from runner.core.errors import RunnerError

_POLL_SECONDS = 0.2
_STOP_SECONDS = 10.0


def start_listening(
    command: Sequence[str],
    port: int,
    name: str,
    seconds: float,
    output: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """``command`` started (its output to ``output``, else ours), returned once 127.0.0.1:``port``
    accepts connections. One error line naming ``name`` if it exits first or is not listening
    after ``seconds`` (then it is stopped)."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RunnerError(f"{name} exited at start ({process.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return process
        time.sleep(_POLL_SECONDS)
    stop_process(process, _STOP_SECONDS)
    raise RunnerError(f"{name} did not listen on 127.0.0.1:{port} within {seconds:g} s")


def stop_process(process: subprocess.Popen[Any], wait_seconds: float) -> None:
    """SIGTERM, up to ``wait_seconds`` for it to exit, then SIGKILL; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
