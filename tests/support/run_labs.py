"""The labs of one test run: named after the run, made by it, torn down by it.

A test run has an identity, ``$FROZEN_BENCH_TEST_RUN``: scripts/test.sh sets a fresh one for
each run (``t<UTC time>-<random>``), so the labs of a CI clone and of a developer's work tree
never meet, and a run never reuses a lab it did not make. Without it (pytest started by hand)
the identity is ``dev-<digest of the checkout's path>``: that checkout's labs are kept between
runs and reused while what deployed them is unchanged.

Every lab of a run is ``<run>-<role>`` (role: ``deploy``, ``demo``, ``tb21``, ...). Beside
each lab's state this module keeps ``deployed-by.json``: the digest of what deployed it (the
deploy and image code, the guest's runner code, the tasks, the lock and its resolution). A lab
whose digest differs from the checkout's is torn down and deployed again.

    python3 -m tests.support.run_labs deploy ROLE LOCK [--freeze]   # scripts/test.sh, beside a tier
    python3 -m tests.support.run_labs teardown                      # every lab of this run
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from runner.core.errors import RunnerError
from runner.core.files import read_model, write_model
from runner.core.models import FrozenModel, Sha256
from runner.core.roots import REPO_ROOT, cache_root
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.transport import guest_machine

TEST_RUN_ENV = "FROZEN_BENCH_TEST_RUN"
# What a lab's deploy is made of: a change to any of these files is a different lab.
DEPLOY_INPUTS = ("deploy.py", "deploy", "images", "inventory", "runner", "tasks")


def test_run() -> str:
    """This run's identity (the module's docstring says where it comes from)."""
    given = os.environ.get(TEST_RUN_ENV)
    if given:
        return given
    return "dev-" + hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:8]


def lab_for(role: str) -> str:
    """The name of this run's lab for ``role``."""
    return f"{test_run()}-{role}"


class DeployedBy(FrozenModel):
    """``deployed-by.json``: the run that deployed a lab and the digest of what it deployed."""

    test_run: str
    lock: str
    deploy_sha256: Sha256


def _deployed_by_path(lab: str) -> Path:
    return LabPaths.for_lab(lab).lab_dir / "deployed-by.json"


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(
        path
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def deploy_digest(lock: str) -> str:
    """The digest of everything that makes the lab ``lock``'s deploy: the deploy inputs' files
    (by path and content), the lock and its resolution."""
    lock_path = REPO_ROOT / lock
    inputs = [REPO_ROOT / name for name in DEPLOY_INPUTS]
    inputs += [lock_path, lock_path.with_name(f"{lock_path.stem}.resolved.json")]
    digest = hashlib.sha256()
    for root in inputs:
        for path in _files(root):
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"sha256:{digest.hexdigest()}"


def _answers(paths: LabPaths) -> bool:
    if not paths.state.exists():
        return False
    try:
        guest_machine(load_lab_state(paths), wait_seconds=120)
    except RunnerError:
        return False
    return True


def _reusable(lab: str, lock: str) -> bool:
    """The lab was deployed by this run's identity from what this checkout holds, and answers."""
    recorded = _deployed_by_path(lab)
    if not recorded.exists():
        return False
    try:
        deployed_by = read_model(recorded, DeployedBy)
    except RunnerError:
        return False
    expected = DeployedBy(test_run=test_run(), lock=lock, deploy_sha256=deploy_digest(lock))
    return deployed_by == expected and _answers(LabPaths.for_lab(lab))


def run_command(command: list[str], env: dict[str, str] | None = None, show: bool = False) -> str:
    """A command of the project from the repository root, asserted to succeed: its stdout, or
    with ``show`` its output passed through as it comes (a long step's progress in a log)."""
    result = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=not show,
        text=True,
        check=False,
    )
    tail = "(its output is above)" if show else result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, f"{' '.join(command)}: exit {result.returncode} {tail}"
    return result.stdout or ""


def ensure_deployed(lab: str, lock: str, show: bool = False) -> LabState:
    """The lab, deployed for ``lock`` by this run as the README's first command does (artifacts
    into the host cache, then converge), unless this run deployed it from the same inputs."""
    if not _reusable(lab, lock):
        env = {"LAB": lab, "LOCK": lock}
        for command in (
            ["runner", "teardown", "--lab", lab],
            ["runner", "resolve", lock],
            ["pyinfra", "-y", "inventory/local.py", "deploy.py"],
        ):
            run_command(command, env, show)
        write_model(
            _deployed_by_path(lab),
            DeployedBy(test_run=test_run(), lock=lock, deploy_sha256=deploy_digest(lock)),
        )
    return load_lab_state(LabPaths.for_lab(lab))


def run_labs() -> list[str]:
    """This run's labs: those with a lab directory on the controller and those libvirt still
    has (a lab whose directory went first)."""
    prefix = f"{test_run()}-"
    lab_root = cache_root() / "lab"
    named = {path.name for path in lab_root.glob(f"{prefix}*")} if lab_root.is_dir() else set()
    listed = subprocess.run(
        ["virsh", "-c", "qemu:///system", "list", "--all", "--name"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    domain_prefix = f"frozen-bench-{prefix}"
    named |= {
        name.removeprefix("frozen-bench-") for name in listed if name.startswith(domain_prefix)
    }
    return sorted(named)


def teardown_run() -> int:
    """Tear down every lab of this run; the number that failed to go."""
    failed = 0
    for lab in run_labs():
        result = subprocess.run(["runner", "teardown", "--lab", lab], cwd=REPO_ROOT, check=False)
        failed += result.returncode != 0
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m tests.support.run_labs")
    verbs = parser.add_subparsers(dest="verb", required=True)
    deploy = verbs.add_parser("deploy", help="deploy (and freeze) this run's lab for ROLE")
    deploy.add_argument("role")
    deploy.add_argument("lock")
    deploy.add_argument("--freeze", action="store_true", help="then freeze it with the lock")
    verbs.add_parser("teardown", help="tear down every lab of this run")
    args = parser.parse_args()
    if args.verb == "teardown":
        sys.exit(1 if teardown_run() else 0)
    lab = lab_for(args.role)
    print(f"lab {lab}: deploying for {args.lock}", flush=True)
    try:
        ensure_deployed(lab, args.lock, show=True)
        if args.freeze:
            run_command(["runner", "freeze", "--lab", lab, "--lock", args.lock], show=True)
    except AssertionError as failure:
        sys.exit(f"lab {lab}: {failure}")
    print(f"lab {lab}: ready", flush=True)


if __name__ == "__main__":
    main()
