"""A GuestTransport with no guest, after httpx's MockTransport: a handler function stands for the
guest. Given each command (``download <remote dir>`` for a copy-back) it returns an ExecResult or
raises; a copy-back then writes the trial tree the test gave. Paramiko's and the socket's errors a
handler raises become GuestError exactly as over SSH (the same ``connection_errors``). Unless the
test says otherwise, the guest's egress firewall refused nothing: ``answer`` gives its listing,
as nft 1.1.3 printed it (tests/fixtures/egress/)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from runner.core.roots import REPO_ROOT
from runner.lab.egress import READ_COMMAND
from runner.lab.transport import ClosedOnExit, ExecResult, connection_errors, require_ok

Handler = Callable[[str], ExecResult]
HARBOR_RESULTS = REPO_ROOT / "tests" / "harbor_results"
ADDRESS = "fake-guest:22"
EGRESS_LISTINGS = REPO_ROOT / "tests" / "fixtures" / "egress"
NOTHING_REFUSED = (EGRESS_LISTINGS / "nft-1.1.3-nothing-refused.json").read_text()


def answer(command: str, exit_code: int | None = 0, stdout: str | None = None) -> ExecResult:
    """What the guest says to ``command``: an exit code (None: the deadline passed) and stdout
    (by default none, or for the egress read a firewall that refused nothing)."""
    if stdout is None:
        stdout = NOTHING_REFUSED if command == READ_COMMAND else ""
    return ExecResult(command=command, exit_code=exit_code, stdout=stdout, stderr="", seconds=0.0)


def always_ok(command: str) -> ExecResult:
    return answer(command)


def trial_tree(root: Path, result: str | None, assistant_messages: int = 0) -> Path:
    """A Harbor trials directory as the guest would hold it: ``<trial>/result.json`` from the
    fixture ``tests/harbor_results/<result>.json`` (None: Harbor wrote none) and the agent's
    event log with ``assistant_messages`` finished assistant messages."""
    trial = root / "trial-1"
    (trial / "agent").mkdir(parents=True)
    (trial / "harbor.log").write_text("harbor ran\n")
    if result is not None:
        fixture = json.loads((HARBOR_RESULTS / f"{result}.json").read_text())
        (trial / "result.json").write_text(json.dumps(fixture["result"]))
    end = {"type": "message_end", "message": {"role": "assistant", "stopReason": "stop"}}
    (trial / "agent" / "events.jsonl").write_text(
        "".join(json.dumps(end) + "\n" for _ in range(assistant_messages))
    )
    return root


class FakeTransport(ClosedOnExit):
    """``GuestTransport`` over ``handler``; ``trials`` is what a copy-back brings home."""

    def __init__(self, handler: Handler = always_ok, trials: Path | None = None) -> None:
        self.handler = handler
        self.trials = trials
        self.commands: list[str] = []
        self.connects = 0
        self.connected = False

    def connect(self, wait_seconds: float = 0) -> Self:
        self.connects += 1
        self.connected = True
        return self

    def close(self) -> None:
        self.connected = False

    def _ask(self, command: str, doing: str) -> ExecResult:
        self.commands.append(command)
        with connection_errors(ADDRESS, doing):
            return self.handler(command)

    def exec(
        self, command: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        return self._ask(command, "running a command")

    def check(self, command: str, *, timeout: float | None = None) -> ExecResult:
        return require_ok(self.exec(command, timeout=timeout))

    @contextmanager
    def holding(self, command: str, ready: bytes, wait_seconds: float) -> Iterator[None]:
        require_ok(self._ask(command, "running a held command"))
        yield

    def upload(self, local: Path, remote_dir: str) -> None:
        require_ok(self._ask(f"upload {local.name} {remote_dir}", f"copying {local.name} in"))

    def download(self, remote_dir: str, local_parent: Path) -> Path:
        require_ok(self._ask(f"download {remote_dir}", f"copying {remote_dir} back"))
        local = local_parent / remote_dir.rstrip("/").rsplit("/", 1)[1]
        if self.trials is None:
            local.mkdir(parents=True)
        else:
            shutil.copytree(self.trials, local)
        return local
