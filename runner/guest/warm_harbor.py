"""A Harbor process started and imported before the freeze, so that every cell begins from the
same warm process, restored with the guest's memory, instead of paying Harbor's start-up under
emulation (its imports and CLI: ~20 s a cell under TCG, measured by bench/cell_phases.py).

``python -m runner.guest.warm_harbor`` (the guest's unit ``bench-warm-harbor.service``, started
by the freeze just before the guest is saved) imports Harbor's CLI and what a trial loads, makes
the two FIFOs of WARM_DIR and waits on ``request``. A cell writes one ``WarmRequest`` line there
(``launch_command``); the process takes it, removes ``request`` (no second cell can find it
waiting), becomes the cell's Harbor — its output to the cell's log, its process group in the
cell's pgid file so the deadline kills it with everything it started, the cell's environment,
fresh seeds — and writes its exit code to ``done``, which the cell's command waits on. It serves
one cell: the next cell's reset restores it waiting again. A guest without a waiting process
(a run with --no-reset after its first cell) launches Harbor cold; the trial says which
(HARBOR_PROCESS beside it), and the ledger keeps it.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict

WARM_DIR = PurePosixPath("/run/bench/warm-harbor")
REQUEST_FIFO = WARM_DIR / "request"
DONE_FIFO = WARM_DIR / "done"
UNIT = "bench-warm-harbor.service"
# Beside Harbor's trial directory, written as the cell launches Harbor: "warm" or "cold", and
# the guest's clock (`date +%s.%N`) at the hand-over.
HARBOR_PROCESS = "harbor-process"
HARBOR_LAUNCHED_AT = "harbor-launched-at"
HarborProcess = Literal["warm", "cold"]


class WarmRequest(BaseModel):
    """One cell's Harbor: its arguments (after ``harbor``), environment, log and pgid file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: tuple[str, ...]
    environment: dict[str, str]
    log: str
    pgid_file: str


def launch_command(request: WarmRequest, harbor: str) -> str:
    """Shell for the cell: Harbor through the waiting process when there is one, else cold (in
    its own process group, as the warm one is). Either way the markers beside the log say which
    and when Harbor was handed the cell; the command's exit code is Harbor's."""
    trial_dir = shlex.quote(str(PurePosixPath(request.log).parent))
    launched_at = f"{trial_dir}/{HARBOR_LAUNCHED_AT}"
    exports = " ".join(
        f"{name}={shlex.quote(value)}" for name, value in request.environment.items()
    )
    cold = (
        f"echo $$ > {request.pgid_file}; date +%s.%N > {launched_at}; "
        f"exec env {exports} {shlex.join((harbor, *request.argv))}"
    )
    warm = (
        f"date +%s.%N > {launched_at}; "
        f"printf '%s\\n' {shlex.quote(request.model_dump_json())} > {REQUEST_FIFO}; "
        f'code=$(cat {DONE_FIFO}); exit "${{code:-1}}"'
    )
    return (
        f"if [ -p {REQUEST_FIFO} ]; then echo warm > {trial_dir}/{HARBOR_PROCESS}; {warm}; "
        f"else echo cold > {trial_dir}/{HARBOR_PROCESS}; "
        f"setsid bash -c {shlex.quote(cold)} > {shlex.quote(request.log)} 2>&1; fi"
    )


def _warm_up() -> None:
    """What `harbor trial start` imports, before the freeze: its CLI, the trial, Docker's
    environment and this lab's agents (the rest of the cell's work is the cell's)."""
    import harbor.cli.main
    import harbor.environments.docker.docker
    import harbor.models.trial.result
    import harbor.trial.trial  # noqa: F401

    import runner.guest.harbor_agents  # noqa: F401


def _fifo(path: PurePosixPath) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    os.mkfifo(path, 0o600)


def _take_request() -> WarmRequest:
    with open(REQUEST_FIFO, encoding="utf-8") as fifo:
        line = fifo.readline()
    os.unlink(REQUEST_FIFO)
    return WarmRequest.model_validate_json(line)


def _become_the_cells_harbor(request: WarmRequest) -> None:
    with open(request.pgid_file, "w", encoding="ascii") as pgid:
        pgid.write(f"{os.getpgrp()}\n")
    log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, sys.stdout.fileno())
    os.dup2(log, sys.stderr.fileno())
    os.close(log)
    os.environ.update(request.environment)
    # The process's seeds were drawn at boot and are restored with it in every cell: drawn
    # again, as a process started now would.
    random.seed()
    sys.argv = ["harbor", *request.argv]


def _run_harbor(argv: tuple[str, ...]) -> int:
    from harbor.cli.main import app

    try:
        app(args=list(argv), prog_name="harbor")
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main() -> None:
    if os.getpid() != os.getpgrp():
        os.setpgid(0, 0)  # the cell's deadline kills this process's group
    os.makedirs(WARM_DIR, mode=0o700, exist_ok=True)
    _warm_up()
    _fifo(DONE_FIFO)
    _fifo(REQUEST_FIFO)  # last: its presence says the process is waiting
    request = _take_request()
    with open(DONE_FIFO, "w", encoding="ascii") as done:  # the cell's command waits on it
        _become_the_cells_harbor(request)
        code = _run_harbor(request.argv)
        sys.stdout.flush()
        sys.stderr.flush()
        done.write(f"{code}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
