"""Stopping a child process the tool started (a server, a daemon): asked first, then made."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any], wait_seconds: float) -> None:
    """SIGTERM, up to ``wait_seconds`` for it to exit, then SIGKILL; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
