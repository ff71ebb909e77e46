"""``runner execute``: the frozen schedule, one cell at a time, in the frozen guest.

Refuses to start unless the lock, the schedule, the lab's freeze and a fresh verify agree.
At the end: credential scan, final verify, receipt and report.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live

from runner.cells.cell import CellRunner
from runner.core.errors import InputError, RunnerError
from runner.core.files import write_atomic, write_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.freeze.record import load_freeze
from runner.freeze.reset import reset_lab
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.transport import GuestTransport
from runner.proxy import CredentialProxy
from runner.records.ledger import Ledger
from runner.run.progress import RunProgress
from runner.run.receipt import Receipt
from runner.run.report import write_report
from runner.run.run_dir import OpenRun, open_run
from runner.run.scan import SecretKind, new_canary, scan_run
from runner.spec.lock import Lock
from runner.verify.audit import audit, render_drifts, ssh_host_vars
from runner.verify.report import VerifyReport


class GuestDrifted(RunnerError):
    """The guest is not at its frozen state: no cell may run on it."""


@dataclass(frozen=True)
class ExecuteOptions:
    lock_path: Path | None
    run_dir: Path
    lab: str
    reset: bool = True


def check_identities(run: OpenRun, lab: LabState, manifest: FreezeManifest) -> None:
    fingerprint = run.lock.environment_fingerprint
    if lab.environment_fingerprint != fingerprint:
        raise InputError(
            f"lab {lab.lab} was provisioned for environment {lab.environment_fingerprint}, "
            f"not this lock's {fingerprint}: deploy the lab for this lock"
        )
    if manifest.environment_fingerprint != fingerprint:
        raise InputError(
            f"lab {lab.lab} was frozen for environment {manifest.environment_fingerprint}, not "
            f"this lock's {fingerprint}: run `runner freeze` again"
        )


def audit_guest(manifest: FreezeManifest, lab: LabState, evidence: Path) -> VerifyReport:
    report = audit(manifest, ssh_host_vars(lab), evidence)
    if not report.passed:
        raise GuestDrifted(
            f"guest drifted from freeze {manifest.sha256}; refusing to run cells:\n"
            + render_drifts(report)
        )
    return report


def take_provider_keys(lock: Lock) -> dict[str, str]:
    """The models' real keys, taken out of this process's environment into the proxy's hands: no
    child process (Ansible, SSH, pyinfra) inherits one, and no evidence that records its
    environment (ansible-runner's artifacts do) can hold one. The scripted provider needs no
    real key, but the proxy still swaps one in: one is made up for the run, so the credential
    scan has a real key to look for."""
    keys: dict[str, str] = {}
    for model in lock.models:
        key = os.environ.pop(model.key_env, None) or keys.get(model.key_env)
        if key is None and model.base_url.startswith("scripted://"):
            key = secrets.token_urlsafe(32)
        if not key:
            raise InputError(f"model {model.id}: host variable {model.key_env} is not set")
        keys[model.key_env] = key
    return keys


def execute(options: ExecuteOptions, console: Console) -> Receipt:
    run = open_run(options.lock_path, options.run_dir)
    paths = run.paths
    ledger = Ledger(paths)
    if ledger.repair_torn_tail():
        console.print("the ledger's last line was torn by a kill: kept under attempts/")
    lab = load_lab_state(LabPaths.for_lab(options.lab))
    manifest, _saved = load_freeze(options.lab)
    check_identities(run, lab, manifest)
    keys = take_provider_keys(run.lock)
    if options.reset:
        reset_lab(options.lab)
    audit_guest(manifest, lab, paths.verify_dir / "preflight")
    pending = ledger.pending(run.schedule.cells)
    console.print(
        f"{'resuming' if run.resumed else 'starting'} {run.lock.name}: "
        f"{len(run.schedule.cells) - len(pending)} of {len(run.schedule.cells)} cells done, "
        f"schedule {run.schedule.sha256}"
    )
    canary = new_canary()
    write_atomic(paths.attempts_dir / "scan-canary.txt", canary.encode())
    with CredentialProxy(paths, port=lab.proxy_port, keys=keys) as proxy:
        guest = GuestTransport(lab.ssh_host, lab.ssh_port, Path(lab.private_key), lab.ssh_user)
        with guest.connect(wait_seconds=120):
            cells = CellRunner(
                lock=run.lock,
                paths=paths,
                guest=guest,
                proxy=proxy,
                task_root=task_root(run.lock),
                reset_guest=(lambda: reset_lab(options.lab, guest)) if options.reset else None,
            )
            progress = RunProgress(
                total=len(run.schedule.cells), deadline_seconds=run.lock.cell_deadline_seconds
            )
            progress.done.extend(ledger.lines())
            with Live(progress, console=console, refresh_per_second=1, transient=False):
                for cell in pending:
                    progress.start(cell)
                    progress.finish(cells.run(cell, ledger))
        secrets_by_kind: dict[SecretKind, tuple[str, ...]] = {
            "provider_key": proxy.secrets_to_scan()["provider_key"],
            "bearer": proxy.secrets_to_scan()["bearer"],
            "canary": (canary,),
        }
        scan = scan_run(paths, secrets_by_kind)
    console.print(
        f"credential scan: {'clean' if scan.clean else 'NOT clean'} ({scan.files_scanned} files)"
    )
    if options.reset:
        # Every cell ran on a guest restored from the freeze: what the run must not have moved
        # is that frozen state, so it is audited as the next cell would find it. (The last
        # cell's own leftovers, its trial dir and built image, are not frozen state.)
        reset_lab(options.lab)
    final = audit(manifest, ssh_host_vars(lab), paths.verify_dir / "final")
    write_model(paths.final_verify, final)
    console.print(f"final verify: {'passed' if final.passed else 'DRIFT'}")
    return write_report(paths.run_dir)


def task_root(lock: Lock) -> Path:
    """Where the lock's tasks are on the host (a ``path`` source is relative to the repository,
    as the guest deploy reads it)."""
    if lock.tasks.path is None:
        raise InputError("git task sources are not supported by execute yet; use a local path")
    return REPO_ROOT / lock.tasks.path / lock.tasks.subdir
