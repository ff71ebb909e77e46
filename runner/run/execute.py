"""``runner execute``: the frozen schedule, one cell at a time, in the frozen guest.

Three stages: preflight (refuses to start unless the lock, the schedule, the lab's freeze and a
fresh verify agree), cells, finish (credential scan, final verify). Whichever stage raises, the
receipt and the report are written; the receipt then fails closed with the reason.
"""

from __future__ import annotations

import os
import secrets
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.live import Live

from runner.cache.paths import CachePaths
from runner.cells.cell import CellRunner, RunAborted
from runner.core.errors import InputError, RunnerError
from runner.core.files import read_model, write_atomic, write_model
from runner.core.models import FrozenModel, Sha256
from runner.freeze.inventory import DiskInventory
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.freeze.record import load_freeze
from runner.freeze.reset import reset_lab
from runner.lab.disk import quiesced_disk
from runner.lab.mirror import lab_mirror
from runner.lab.snapshot import running_disk
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.task_trees import task_derivations, upstream_root
from runner.lab.transport import GuestTransport, SshTransport
from runner.proxy import CredentialProxy
from runner.records.ledger import Failure, Ledger, now
from runner.records.paths import RunPaths
from runner.records.run_tasks import RunTasks, task_mirror_files
from runner.report.receipt import Receipt, RunAbort, Stage
from runner.report.write import write_report
from runner.run.progress import RunProgress
from runner.run.run_dir import OpenRun, open_run
from runner.scan.guest_disk import (
    DiskFindings,
    guest_findings,
    last_unscanned_attempt,
    own_bearer,
    record_guest_scan,
    scan_disk,
    unreadable,
)
from runner.scan.scan import SecretKind, new_canary, scan_run
from runner.spec.lock import Lock
from runner.spec.resolution import Resolution
from runner.spec.task_derivation import TaskDerivation
from runner.verify.audit import audit_lab, render_drifts
from runner.verify.disk import load_inventory
from runner.verify.report import VerifyReport

GUEST_CONNECT_SECONDS = 120.0


class GuestDrifted(RunnerError):
    """The guest is not at its frozen state: no cell may run on it."""


@dataclass(frozen=True)
class ExecuteOptions:
    lock_path: Path | None
    run_dir: Path
    lab: str
    reset: bool = True
    mirror_withhold: tuple[str, ...] = ()  # FrozenLab.mirror_withhold: for the tests only


class Lab(Protocol):
    """What execute needs of the lab: the seam by which tests run execute without a VM."""

    @property
    def proxy_port(self) -> int: ...

    def check(self, run: OpenRun) -> None:
        """Raise unless the lab was provisioned and frozen for the run's lock."""
        ...

    def transport(self) -> GuestTransport:
        """A transport to the guest, not yet connected."""
        ...

    def reset(self, guest: GuestTransport | None = None) -> object:
        """Restore the guest's frozen state (``guest``: reconnect that transport)."""
        ...

    def audit(self, evidence: Path) -> VerifyReport: ...

    def scan_disk(
        self,
        guest: GuestTransport,
        secrets_by_kind: Mapping[SecretKind, tuple[str, ...]],
        own_bearer: Sha256 | None = None,
    ) -> DiskFindings:
        """The secrets on the guest's disk, in what changed since the freeze (never raises: a
        disk that could not be read is a failure of the scan, runner.scan.guest_disk); the
        digest of the attempt's own bearer, expected in Podman's records of its exec."""
        ...

    def tasks(self, run: OpenRun) -> tuple[TaskDerivation, ...]:
        """The run's tasks as the lab runs them."""
        ...

    def unjudged_tasks(self) -> dict[str, str]:
        """Tasks the lab cannot judge (their oracle did not score 1 at the freeze), and why."""
        ...

    def frozen_manifests(self) -> tuple[FreezeManifest | None, bytes | None]:
        """The freeze manifest the lab runs from and its image's manifest file (None: none),
        kept in the run so a reviewer re-judges from them."""
        ...

    def package_mirror(self, resolution_file: Path) -> AbstractContextManager[Path | None]:
        """The lab's package mirror serving the resolution while the block runs; its log
        (None: the lab has no mirror)."""
        ...


class LabIdentity(FrozenModel):
    """What a lab is: provisioned for, frozen for, the freeze's manifest, how QEMU runs it."""

    lab: str
    environment_fingerprint: str
    freeze_environment_fingerprint: str
    freeze_manifest_sha256: str
    acceleration: str


@dataclass(frozen=True)
class FrozenLab:
    """The lab as deploy and freeze left it: libvirt, the guest over SSH, the freeze."""

    name: str
    state: LabState
    manifest: FreezeManifest
    inventory: DiskInventory  # the freeze's disk inventory (the guest disk scan's baseline)
    # Packages the mirror leaves out of the frozen set: a fault for the tests (a verifier that
    # cannot set up must be verifier_setup, not fail); never set by a run of the lock.
    mirror_withhold: tuple[str, ...] = ()

    @classmethod
    def load(cls, name: str, mirror_withhold: tuple[str, ...] = ()) -> FrozenLab:
        manifest, _saved = load_freeze(name)
        inventory = load_inventory(FreezePaths.for_lab(name).disk_inventory, manifest)
        state = load_lab_state(LabPaths.for_lab(name))
        return cls(name, state, manifest, inventory, mirror_withhold)

    @property
    def proxy_port(self) -> int:
        return self.state.proxy_port

    def check(self, run: OpenRun) -> None:
        check_identities(run, self.state, self.manifest)

    def identity(self) -> LabIdentity:
        return LabIdentity(
            lab=self.name,
            environment_fingerprint=self.state.environment_fingerprint,
            freeze_environment_fingerprint=self.manifest.environment_fingerprint,
            freeze_manifest_sha256=self.manifest.sha256,
            acceleration=self.state.acceleration.kind,
        )

    def unjudged_tasks(self) -> dict[str, str]:
        return {
            score.task: (
                f"the lab's oracle of {score.task} scored {score.reward:g} at the freeze "
                f"({score.tolerated or 'timing-sensitive under emulation'}, under "
                f"{self.state.acceleration.kind.upper()}; its verifier's last lines are in the "
                "freeze manifest)"
            )
            for score in self.manifest.oracle
            if not score.judges
        }

    def frozen_manifests(self) -> tuple[FreezeManifest | None, bytes | None]:
        image = Path(self.state.image.store_dir) / "manifest.json"
        return self.manifest, image.read_bytes() if image.is_file() else None

    def tasks(self, run: OpenRun) -> tuple[TaskDerivation, ...]:
        """Derived here again from the run's resolution; a freeze that recorded its tasks
        (``runner freeze --lock``) must have recorded these."""
        derived = run_task_derivations(run)
        if self.manifest.tasks and self.manifest.tasks != derived:
            raise InputError(
                f"lab {self.name} was frozen with other task trees than this run's: run "
                "`runner freeze` again"
            )
        return derived

    def transport(self) -> GuestTransport:
        return SshTransport.for_lab(self.state)

    def reset(self, guest: GuestTransport | None = None) -> object:
        return reset_lab(self.name, guest)

    def audit(self, evidence: Path) -> VerifyReport:
        return audit_lab(self.state, evidence)

    def scan_disk(
        self,
        guest: GuestTransport,
        secrets_by_kind: Mapping[SecretKind, tuple[str, ...]],
        own_bearer: Sha256 | None = None,
    ) -> DiskFindings:
        try:
            with quiesced_disk(guest, Path(running_disk(self.state))) as disk:
                return scan_disk(disk.root, self.inventory, secrets_by_kind, own_bearer)
        except RunnerError as error:
            return unreadable(error)

    @contextmanager
    def package_mirror(self, resolution_file: Path) -> Iterator[Path | None]:
        if self.state.mirror_port is None:
            yield None
            return
        with lab_mirror(self.name, resolution_file, self.mirror_withhold) as log:
            yield log


def run_task_derivations(run: OpenRun) -> tuple[TaskDerivation, ...]:
    """The run's tasks as derived from its lock and the resolution recorded in the run."""
    recorded = (
        read_model(run.paths.resolution, Resolution).tasks if run.paths.resolution.is_file() else ()
    )
    return task_derivations(run.lock, recorded)


def run_tasks(run: OpenRun, tasks: tuple[TaskDerivation, ...]) -> RunTasks:
    """The run's tasks.json: ``tasks``, and what the mirror serves each beyond the frozen
    guest, from the resolution recorded in the run."""
    artifacts = (
        read_model(run.paths.resolution, Resolution).artifacts
        if run.paths.resolution.is_file()
        else ()
    )
    return RunTasks(tasks=tasks, mirror_files=task_mirror_files(artifacts))


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


def audit_guest(lab: Lab, evidence: Path) -> VerifyReport:
    report = lab.audit(evidence)
    if not report.passed:
        raise GuestDrifted(
            f"guest drifted from freeze {report.freeze_manifest_sha256}; refusing to run cells:\n"
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
        if key is None and model.is_scripted:
            key = secrets.token_urlsafe(32)
        if not key:
            raise InputError(f"model {model.id}: host variable {model.key_env} is not set")
        keys[model.key_env] = key
    return keys


def keep_frozen_manifests(paths: RunPaths, lab: Lab) -> None:
    """The lab's freeze and image manifests in the run (written again when it resumes: the lab
    was checked to be the run's by then)."""
    freeze, image = lab.frozen_manifests()
    if freeze is not None:
        write_model(paths.freeze_manifest, freeze)
    if image is not None:
        write_atomic(paths.image_manifest, image)


def preflight(
    run: OpenRun, ledger: Ledger, lab: Lab, reset: bool, console: Console
) -> tuple[dict[str, str], str]:
    """Everything that must agree before a cell runs; returns the provider keys and the run's
    canary for the credential scan."""
    if ledger.repair_torn_tail():
        console.print("the ledger's last line was torn by a kill: kept under attempts/")
    lab.check(run)
    write_model(run.paths.tasks, run_tasks(run, lab.tasks(run)))
    keep_frozen_manifests(run.paths, lab)
    keys = take_provider_keys(run.lock)
    if run.resumed:
        scan_left_behind(run, ledger, lab, keys)
    if reset:
        lab.reset()
    audit_guest(lab, run.paths.verify_dir / "preflight")
    pending = ledger.pending(run.schedule.cells)
    console.print(
        f"{'resuming' if run.resumed else 'starting'} {run.lock.name}: "
        f"{len(run.schedule.cells) - len(pending)} of {len(run.schedule.cells)} cells done, "
        f"schedule {run.schedule.sha256}"
    )
    canary = new_canary()
    write_atomic(run.paths.scan_canary, canary.encode())
    return keys, canary


def run_cells(
    run: OpenRun,
    ledger: Ledger,
    lab: Lab,
    proxy: CredentialProxy,
    reset: bool,
    console: Console,
    mirror_log: Path | None = None,
) -> None:
    """The pending cells in schedule order; a cell that must stop the run raises RunAborted."""
    with lab.transport().connect(wait_seconds=GUEST_CONNECT_SECONDS) as guest:
        cells = cell_runner(run, lab, guest, proxy, reset, mirror_log)
        progress = RunProgress(
            total=len(run.schedule.cells), deadline_seconds=run.lock.cell_deadline_seconds
        )
        progress.done.extend(ledger.lines())
        with Live(progress, console=console, refresh_per_second=1, transient=False):
            for cell in ledger.pending(run.schedule.cells):
                progress.start(cell)
                progress.finish(cells.run(cell, ledger))


def cell_runner(
    run: OpenRun,
    lab: Lab,
    guest: GuestTransport,
    proxy: CredentialProxy,
    reset: bool,
    mirror_log: Path | None,
    on_phase: Callable[[str], None] | None = None,
) -> CellRunner:
    """The cells of ``run`` on the lab's connected ``guest``, each reset first (``reset``), its
    guest disk scanned after each attempt."""
    return CellRunner(
        lock=run.lock,
        paths=run.paths,
        guest=guest,
        proxy=proxy,
        task_root=task_root(run.lock),
        reset_guest=(lambda: lab.reset(guest)) if reset else None,
        mirror_log=mirror_log,
        unjudged=lab.unjudged_tasks(),
        scan_guest=lambda cell, attempt: record_guest_scan(
            run.paths,
            cell,
            attempt,
            lab.scan_disk(guest, guest_secrets(proxy), own_bearer(run.paths, cell, attempt)),
        ),
        on_phase=on_phase,
    )


def scan_left_behind(run: OpenRun, ledger: Ledger, lab: Lab, keys: dict[str, str]) -> None:
    """The guest's disk as a killed runner left it, scanned for that attempt before the reset
    throws it away (the bearers that runner issued are found by their shape)."""
    unscanned = last_unscanned_attempt(ledger)
    if unscanned is None:
        return
    secrets: dict[SecretKind, tuple[str, ...]] = {"provider_key": tuple(keys.values())}
    try:
        with lab.transport().connect(wait_seconds=GUEST_CONNECT_SECONDS) as guest:
            findings = lab.scan_disk(guest, secrets, own_bearer(run.paths, *unscanned))
    except RunnerError as error:
        findings = unreadable(error)
    record_guest_scan(run.paths, *unscanned, findings)


def guest_secrets(proxy: CredentialProxy) -> dict[SecretKind, tuple[str, ...]]:
    """What must never be on the guest's disk: the real keys and every bearer issued so far."""
    secrets = proxy.secrets_to_scan()
    return {"provider_key": secrets["provider_key"], "bearer": secrets["bearer"]}


def finish(
    paths: RunPaths, lab: Lab, proxy: CredentialProxy, canary: str, reset: bool, console: Console
) -> None:
    """The credential scan of everything the run kept, then the final verify."""
    secrets_by_kind = {**guest_secrets(proxy), "canary": (canary,)}
    scan = scan_run(paths, secrets_by_kind, found_elsewhere=guest_findings(paths))
    console.print(
        f"credential scan: {'clean' if scan.clean else 'NOT clean'} ({scan.files_scanned} files)"
    )
    if reset:
        # Every cell ran on a guest restored from the freeze: what the run must not have moved
        # is that frozen state, so it is audited as the next cell would find it. (The last
        # cell's own leftovers, its trial dir and built image, are not frozen state.)
        lab.reset()
    final = lab.audit(paths.verify_dir / "final")
    write_model(paths.final_verify, final)
    console.print(f"final verify: {'passed' if final.passed else 'DRIFT'}")


def execute(options: ExecuteOptions, console: Console, lab: Lab | None = None) -> Receipt:
    """Preflight, cells, finish. However it ends, receipt.json and the report are written from
    what is on disk; a run that raised also leaves aborted.json (its receipt: failed_closed)
    and raises RunAborted, one line. ``lab``: the lab's seam for tests (default: the frozen lab
    named by the options)."""
    run = open_run(options.lock_path, options.run_dir)
    set_aside_earlier_abort(run.paths)
    ledger = Ledger(run.paths)
    stage: Stage = "preflight"
    try:
        lab = lab or FrozenLab.load(options.lab, options.mirror_withhold)
        keys, canary = preflight(run, ledger, lab, options.reset, console)
        stage = "cells"
        with (
            lab.package_mirror(run.paths.resolution) as mirror_log,
            CredentialProxy(run.paths, port=lab.proxy_port, keys=keys) as proxy,
        ):
            run_cells(run, ledger, lab, proxy, options.reset, console, mirror_log)
        stage = "finish"
        finish(run.paths, lab, proxy, canary, options.reset, console)
    except Exception as error:
        raise record_abort(run.paths, stage, error) from error
    finally:
        # Also after a KeyboardInterrupt: the receipt says what finished (failed closed).
        receipt = write_report(run.paths.run_dir)
    return receipt


def set_aside_earlier_abort(paths: RunPaths) -> None:
    """An earlier execute's abort is evidence of that execute, not of this one: kept under
    attempts/, so the receipt of this execute is not failed by it."""
    if paths.aborted.exists():
        stamp = now().strftime("%Y%m%dT%H%M%S%fZ")
        paths.attempts_dir.mkdir(parents=True, exist_ok=True)
        paths.aborted.rename(paths.earlier_abort(stamp))


def record_abort(paths: RunPaths, stage: Stage, error: Exception) -> RunAborted:
    """Write aborted.json (with the traceback, for whoever debugs it) and return the one-line
    error the CLI prints; it keeps the exit code of a RunnerError."""
    record = RunAbort(
        failure=Failure.of(error, stage),
        aborted_at=now(),
        traceback="".join(traceback.format_exception(error)),
    )
    write_model(paths.aborted, record)
    aborted = RunAborted(f"{record.reason} (receipt failed_closed: {paths.receipt})")
    aborted.exit_code = error.exit_code if isinstance(error, RunnerError) else 1
    return aborted


def task_root(lock: Lock) -> Path:
    """Where the lock's tasks are on the host, as upstream has them (a ``path`` source is
    relative to the repository; a git source is the commit ``runner resolve`` checked out)."""
    return upstream_root(lock, CachePaths.default())
