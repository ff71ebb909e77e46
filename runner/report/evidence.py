"""What a run directory proves, read for the report: the receipt built from its lock, schedule,
ledger, proxy records, scan, final verify and freeze.json, and what the sections add from the
run's files (each cell's first request, tasks.json)."""

from __future__ import annotations

from runner.core.errors import InputError
from runner.core.files import read_model
from runner.core.models import updated
from runner.freeze.manifest import FreezeManifest
from runner.proxy.models import ProxyCellCounts
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.run_tasks import RunTasks
from runner.records.schedule import Schedule
from runner.report.analysis import UnjudgedTasks, unjudged_by_freeze, unjudged_by_ledger
from runner.report.identities import frozen_digests
from runner.report.judge import Judge
from runner.report.receipt import EvidenceState, Receipt, RunAbort, build_receipt
from runner.spec.lock import load_lock
from runner.verify.report import VerifyReport


def load_run(paths: RunPaths, signed_by: str | None = None, judge: Judge | None = None) -> Receipt:
    """The receipt the run's files prove; ``signed_by``: the public key that will sign it;
    ``judge``: the runner and host venv that judge it (a check of a signed receipt passes the
    one the receipt names: it is no file of the run's)."""
    if not paths.run_dir.is_dir():
        raise InputError(f"{paths.run_dir}: no such run directory")
    lock = load_lock(paths.lock)
    schedule = read_model(paths.schedule, Schedule)
    if schedule.lock_fingerprint != lock.fingerprint:
        raise InputError(f"{paths.schedule}: schedule was made from another lock")
    ledger = Ledger(paths)
    lines = ledger.lines()
    chain = ledger.chain()
    broken = chain.broken_at if chain and chain.state == "broken" else None
    aborted = read_model(paths.aborted, RunAbort) if paths.aborted.exists() else None
    frozen = frozen_digests(paths)
    freeze = (
        read_model(paths.freeze_manifest, FreezeManifest)
        if paths.freeze_manifest.is_file()
        else None
    )
    receipt = build_receipt(
        lock,
        schedule,
        lines,
        scan_state(paths),
        verify_state(paths, schedule),
        aborted,
        records=proxy_records(paths, lines),
        evidence_reasons=((f"ledger chain broken: {broken}",) if broken else ())
        + leak_reasons(paths)
        + unaudited_freeze(freeze, frozen.freeze_manifest_sha256),
        unjudged=unjudged_tasks(freeze, lines),
        judge=judge,
    )
    evidence = {"ledger_chain": chain, "frozen": frozen, "signed_by": signed_by}
    return with_reference_versions(updated(receipt, **evidence), lock.reference_versions)


def scan_state(paths: RunPaths) -> EvidenceState:
    from runner.scan.scan import ScanReport  # the scan room owns its file format

    if not paths.scan.exists():
        return "missing"
    scan = read_model(paths.scan, ScanReport)
    if scan.leaks:
        return "leaks"
    return "clean" if scan.clean else "failed"


def leak_reasons(paths: RunPaths, shown: int = 5) -> tuple[str, ...]:
    """What the credential scan found where, the first ``shown`` of it (the rest counted)."""
    from runner.scan.scan import ScanReport

    if not paths.scan.exists():
        return ()
    leaks = read_model(paths.scan, ScanReport).leaks
    reasons = [f"credential scan: a {leak.kind} in {leak.file}" for leak in leaks[:shown]]
    if len(leaks) > shown:
        reasons.append(f"credential scan: {len(leaks) - shown} more leaks (scan.json)")
    return tuple(reasons)


def verify_state(paths: RunPaths, schedule: Schedule) -> EvidenceState:
    """The final audit's verdict: the run's lab's, or in a fleet run each batch's (of the host
    it ended on): "missing" while any batch has none."""
    if paths.final_verify.exists():
        finals = [paths.final_verify]
    else:
        finals = paths.host_final_verifies
        audited = {path.stem.removeprefix("final-") for path in finals}
        if not finals or any(batch.id not in audited for batch in schedule.batches):
            return "missing"
    passed = all(read_model(path, VerifyReport).passed for path in finals)
    return "passed" if passed else "failed"


def unjudged_tasks(freeze: FreezeManifest | None, lines: list[LedgerLine]) -> UnjudgedTasks:
    """The tasks the oracle of the run's freeze.json did not score 1, for runs recorded before
    the cell runner overruled them too; by the ledger when the run kept no freeze.json (a fleet
    run, an older run) or one without oracle scores."""
    if freeze is None:
        return unjudged_by_ledger(lines)
    if not freeze.oracle:
        return unjudged_by_ledger(lines, freeze.sha256)
    return unjudged_by_freeze(freeze)


def unaudited_freeze(freeze: FreezeManifest | None, audited: str | None) -> tuple[str, ...]:
    """A kept freeze.json the final verify did not audit contradicts the run's evidence, as a
    broken chain does: the run fails closed (check-archive refuses it too)."""
    if freeze is None or audited is None or freeze.sha256 == audited:
        return ()
    return (f"freeze.json: its sha256 is {freeze.sha256}, the final verify audited {audited}",)


def with_reference_versions(receipt: Receipt, reference: dict[str, str]) -> Receipt:
    """Beside each tool the lock pins at another version than the reference run used (none of
    the sources had that one), a row with the reference run's version."""
    tools: dict[str, str] = {}
    for tool, version in receipt.identities.tools.items():
        tools[tool] = version
        if tool in reference:
            tools[f"{tool} (reference run)"] = reference[tool]
    identities = updated(receipt.identities, tools=tools)
    return updated(receipt, identities=identities)


def proxy_records(paths: RunPaths, lines: list[LedgerLine]) -> dict[str, ProxyCellCounts]:
    """The proxy record of each ledger line's cell that has one."""
    found = ((line.cell_id, paths.proxy_counts(line.cell_id)) for line in lines)
    return {cell: read_model(path, ProxyCellCounts) for cell, path in found if path.exists()}


def first_requests(paths: RunPaths) -> dict[str, tuple[PromptFootprint, ...]]:
    """Per harness (by its label, in the order of its id), the first request of each of its
    cells that the proxy recorded on the ledger line; harnesses without one are left out."""
    labels = {harness.id: harness.label for harness in load_lock(paths.lock).harnesses}
    seen: dict[str, list[PromptFootprint]] = {}
    for line in Ledger(paths).lines():
        if line.first_request is not None:
            seen.setdefault(line.harness, []).append(line.first_request)
    return {labels.get(harness, harness): tuple(found) for harness, found in sorted(seen.items())}


def read_run_tasks(paths: RunPaths) -> RunTasks:
    return read_model(paths.tasks, RunTasks) if paths.tasks.is_file() else RunTasks(tasks=())
