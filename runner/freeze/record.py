"""``runner freeze``: record the guest's state as a FreezeManifest, then save it to reset to.

In the guest, only what no disk holds: one exec of runner/guest/collect_state.py (the guest's
python3, printing JSON: kernel, dpkg's package set, Podman images, listening sockets, the
egress table, the waiting units) and one per live category (runner.freeze.live). Then the
guest's free memory is zeroed (a smaller memory image, runner/guest/zero_free_memory.py) and the
running guest is saved; nothing else of ours runs in the guest in between. The saved disk is
never written again: the host reads it whole, at native speed (runner.freeze.inventory), so the
manifest describes exactly what a reset returns to.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from runner.core.errors import InputError, RunnerError, describe_validation_error
from runner.core.files import read_model, write_model
from runner.core.models import updated
from runner.core.timing import PhaseTimer
from runner.freeze.inventory import inventory_of, read_disk
from runner.freeze.live import (
    LIVE_PROBES,
    SPEED_COMMAND,
    concurrent_command,
    frame_nonce,
    framed_sections,
    parse_lines,
    parse_speed,
)
from runner.freeze.manifest import (
    Collected,
    FreezeManifest,
    FreezeScope,
    GuestState,
    OracleScore,
    SpeedFigures,
)
from runner.freeze.oracle import oracle_smoke
from runner.freeze.paths import FreezePaths
from runner.freeze.taint import TAINT_FILE, TAINT_SYSCTL, taint_words
from runner.guest import warm_harbor
from runner.lab.disk import quiesced_disk
from runner.lab.layout import GUEST
from runner.lab.mirror import lab_mirror
from runner.lab.oracle_run import OracleRun
from runner.lab.snapshot import SavedState, save_frozen_state
from runner.lab.state import LabPaths, LabState, load_lab_state
from runner.lab.task_trees import task_derivations
from runner.lab.transport import GuestTransport, SshTransport
from runner.spec.lock import Lock
from runner.spec.resolution import load_resolution, load_resolved_lock, resolution_path
from runner.spec.task_derivation import TaskDerivation

COLLECT_SCRIPT = "guest/collect_state.py"
ZERO_MEMORY_SCRIPT = "guest/zero_free_memory.py"
# Hashing the trees under TCG is the slow part (measured: see bench/verify_reset.py).
COLLECT_TIMEOUT_SECONDS = 900.0
GUEST_WAIT_SECONDS = 60.0
# Harbor's imports under TCG take ~20 s; a loaded host, more.
WARM_HARBOR_WAIT_SECONDS = 180


@dataclass(frozen=True)
class Frozen:
    manifest: FreezeManifest
    saved: SavedState
    # Each step's seconds: oracles (with a lock), prepare (the share unmounted, Podman's
    # lingering monitors ended, Harbor warm), guest (its state read in it), zero memory, save
    # (and the restore on a new live layer), disk (read on the host).
    seconds: dict[str, float]


def collect(guest: GuestTransport, scope: FreezeScope) -> tuple[Collected, float]:
    """The guest's state as the collection script sees it, and the seconds it took."""
    script = resources.files("runner").joinpath(COLLECT_SCRIPT).read_bytes()
    command = f"python3 - {shlex.quote(scope.model_dump_json())}"
    result = guest.exec(command, stdin=script, timeout=COLLECT_TIMEOUT_SECONDS)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"collecting the guest's state failed ({result.exit_code}): {last}")
    try:
        return Collected.model_validate(json.loads(result.stdout)), result.seconds
    except (ValueError, ValidationError) as error:
        detail = (
            describe_validation_error("guest state", error)
            if isinstance(error, ValidationError)
            else f"guest state is not JSON: {error}"
        )
        raise RunnerError(detail) from None


def observe_live(guest: GuestTransport, scope: FreezeScope) -> dict[str, dict[str, str]]:
    """Each live category's map, by the command the audit runs too (runner.freeze.live)."""
    nonce = frame_nonce()
    commands = {probe.category: probe.command(scope) for probe in LIVE_PROBES}
    result = guest.exec(f"set -o pipefail; {concurrent_command(commands, nonce)}", timeout=300)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"reading the guest's live state failed: {last}")
    sections = framed_sections(result.stdout, tuple(commands), nonce)
    return {category: parse_lines(sections[category]) for category in commands}


def measure_speed(guest: GuestTransport, live_seconds: float) -> SpeedFigures:
    """The speed probe (runner.freeze.live.SPEED_COMMAND), with how long the live state took."""
    result = guest.exec(f"set -o pipefail; {SPEED_COMMAND}", timeout=300)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"the guest's speed probe failed: {last}")
    try:
        cpu, disk = parse_speed(result.stdout)
    except (KeyError, ValueError):
        raise RunnerError(f"the guest's speed probe printed {result.stdout!r}") from None
    return SpeedFigures(cpu_seconds=cpu, disk_seconds=disk, live_seconds=round(live_seconds, 3))


def warm_harbor_waiting(guest: GuestTransport) -> None:
    """A warm Harbor process that has served nothing, waiting for a cell, in the saved guest
    (runner/guest/warm_harbor.py): restarted, then awaited until its request FIFO exists."""
    waited = (
        f"systemctl restart {warm_harbor.UNIT} && "
        f"for _ in $(seq {WARM_HARBOR_WAIT_SECONDS * 5}); do "
        f"[ -p {warm_harbor.REQUEST_FIFO} ] && exit 0; sleep 0.2; done; "
        f"systemctl status --no-pager {warm_harbor.UNIT}; exit 1"
    )
    result = guest.exec(waited, timeout=WARM_HARBOR_WAIT_SECONDS + 30)
    if not result.ok:
        last = ((result.stdout + result.stderr).strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"the warm Harbor process did not start waiting: {last}")


def zero_free_memory(guest: GuestTransport) -> None:
    """Drop the guest's page cache and zero its free memory: a smaller image, a faster reset."""
    script = resources.files("runner").joinpath(ZERO_MEMORY_SCRIPT).read_bytes()
    result = guest.exec("python3 -", stdin=script, timeout=COLLECT_TIMEOUT_SECONDS)
    if not result.ok:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"zeroing the guest's free memory failed ({result.exit_code}): {last}")


_KERNEL_COMPLAINTS = "soft lockup|BUG:|WARNING:|Oops|hung_task"


def kernel_as_observed(guest: GuestTransport, live: dict[str, dict[str, str]]) -> None:
    """The freeze's last look in the guest before the save: the kernel's taint mask must still
    be the one its live state was read with. A soft lockup or a warning during the freeze's own
    later steps would be saved into the memory image, restored by every reset and named by
    every audit after it; the freeze stops instead, with the kernel's own words."""
    observed = live.get("sysctl", {}).get(TAINT_SYSCTL)
    now = guest.check(f"cat {TAINT_FILE}", timeout=60).stdout.strip()
    if observed is None or now == observed:
        return
    said = guest.exec(f"dmesg | grep -E '{_KERNEL_COMPLAINTS}' | tail -2", timeout=60).stdout
    lines = " | ".join(line.strip() for line in said.strip().splitlines()) or "nothing in dmesg"
    raise RunnerError(
        f"the guest's kernel was tainted during the freeze, after its state was read: "
        f"{taint_words(observed)} -> {taint_words(now)}; the kernel said: {lines}; nothing was "
        "saved: run `runner freeze` again (on a host less loaded)"
    )


def lock_for(lab: LabState, lock_path: Path) -> Lock:
    """The lock given on the command line, which must share the lab's environment."""
    lock = load_resolved_lock(lock_path)
    if lock.environment_fingerprint != lab.environment_fingerprint:
        raise InputError(
            f"{lock_path}: environment {lock.environment_fingerprint} is not the one lab "
            f"{lab.lab} was deployed for ({lab.environment_fingerprint})"
        )
    return lock


def lab_tasks(lock: Lock, lock_path: Path) -> tuple[TaskDerivation, ...]:
    """The lock's tasks as the lab runs them (the trees deploy packed for the guest)."""
    resolution = load_resolution(resolution_path(lock_path, lock), lock, lock_path)
    return task_derivations(lock, resolution.tasks)


def _oracle_scores(
    lab: LabState, guest: GuestTransport, lock: Lock, lock_path: Path
) -> tuple[OracleScore, ...]:
    """Every task's oracle, with the lab's package mirror up for the verifiers."""
    # Timing-sensitive tasks (lock tasks.timing_sensitive) are held strictly under KVM only.
    tolerated = lock.tasks.tolerated(emulated=lab.acceleration.kind == "tcg")
    with lab_mirror(lab.lab, resolution_path(lock_path, lock)):
        runs = oracle_smoke(guest, lock.tasks.ids, frozenset(tolerated))
    return tuple(oracle_score(run, tolerated.get(run.task, "")) for run in runs)


def oracle_score(run: OracleRun, tolerated: str = "") -> OracleScore:
    """A run's score as the freeze manifest keeps it (no reward is kept as 0: not 1 either);
    ``tolerated``: why the lock lets it fail here, kept when it did."""
    return OracleScore(
        task=run.task,
        reward=run.reward or 0.0,
        seconds=run.seconds,
        verifier_last_lines=run.last_lines or run.log_lines,
        harbor_said=run.harbor_said,
        tolerated=tolerated if run.reward != 1 else "",
    )


ARTIFACTS = GUEST.artifacts_mount
# Podman's monitor of an exec session (the oracle's `docker exec`s) lingers 300 s after the exec
# ended (conmon --exit-delay) and then exits by itself: frozen, it would leave every restored
# guest a few minutes later. The freeze ends them first; nothing else is waiting on them.
# (Both patterns are anchored at the executable: unanchored, they match this command's own bash.)
END_LINGERING_EXEC_MONITORS = (
    "pkill -f '^/usr/bin/conmon .*--exec-attach'; "
    "for _ in $(seq 100); do"
    " pgrep -f '^/usr/bin/(conmon .*--exec-attach|podman .*container cleanup)' >/dev/null"
    " || break; sleep 0.2; done; true"
)


def freeze_lab(lab_name: str, scope: FreezeScope, lock_path: Path | None = None) -> Frozen:
    """Record the guest's state and save it. With ``lock_path``: the lock's tasks as the lab
    runs them are recorded, and every task's oracle must score 1 first (runner.freeze.oracle)."""
    lab = load_lab_state(LabPaths.for_lab(lab_name))
    lock = lock_for(lab, lock_path) if lock_path is not None else None
    tasks = lab_tasks(lock, lock_path) if lock is not None and lock_path is not None else ()
    oracle: tuple[OracleScore, ...] = ()
    timer = PhaseTimer()
    with SshTransport.for_lab(lab).connect(GUEST_WAIT_SECONDS) as guest:
        if lock is not None and lock_path is not None:
            with timer.phase("oracles"):
                oracle = _oracle_scores(lab, guest, lock, lock_path)
        with timer.phase("prepare"):
            # QEMU refuses to save a domain while a virtio-9p export is mounted in it (a
            # migration blocker); provisioning is over, so the artifact share is unmounted.
            guest.check(f"! mountpoint -q {ARTIFACTS} || umount {ARTIFACTS}", timeout=60)
            guest.check(END_LINGERING_EXEC_MONITORS, timeout=120)
            warm_harbor_waiting(guest)
        with timer.phase("guest"):
            collected, _ = collect(guest, scope)
            live_started = time.monotonic()
            live = observe_live(guest, scope)
            speed = measure_speed(guest, time.monotonic() - live_started)
        with timer.phase("zero memory"):
            zero_free_memory(guest)
        kernel_as_observed(guest, live)
    with timer.phase("save"):
        saved = save_frozen_state(lab)
    # The saved disk is read as every verify after a reset reads it: through the guest, now
    # restored on an empty live layer, which syncs and freezes its filesystem while the host
    # copies that layer (so the host sees the page cache the memory image holds, and a clean
    # journal).
    with (
        timer.phase("disk"),
        SshTransport.for_lab(lab).connect(GUEST_WAIT_SECONDS) as guest,
        quiesced_disk(guest, Path(saved.live_disk)) as disk,
    ):
        observed = read_disk(disk, scope.disk_excludes)
    inventory = inventory_of(observed, scope.disk_excludes)
    manifest = FreezeManifest(
        lab=lab.lab,
        environment_fingerprint=lab.environment_fingerprint,
        scope=scope,
        state=GuestState.of(collected, live, inventory, observed, scope, speed),
        tasks=tasks,
        oracle=oracle,
    )
    saved = updated(saved, freeze_manifest_sha256=manifest.sha256)
    paths = FreezePaths.for_lab(lab_name)
    write_model(paths.disk_inventory, inventory)
    write_model(paths.manifest, manifest)
    write_model(paths.saved_state, saved)
    return Frozen(
        manifest=manifest,
        saved=saved,
        seconds=timer.seconds,
    )


def load_freeze(lab_name: str) -> tuple[FreezeManifest, SavedState]:
    """The lab's freeze manifest and saved state, which must belong together."""
    paths = FreezePaths.for_lab(lab_name)
    if not paths.manifest.exists():
        raise InputError(f"lab {lab_name} has not been frozen: run `runner freeze` first")
    manifest = read_model(paths.manifest, FreezeManifest)
    saved = read_model(paths.saved_state, SavedState)
    if saved.freeze_manifest_sha256 != manifest.sha256:
        raise InputError(
            f"{paths.saved_state} belongs to freeze {saved.freeze_manifest_sha256}, not to "
            f"{paths.manifest} ({manifest.sha256}): run `runner freeze` again"
        )
    return manifest, saved
