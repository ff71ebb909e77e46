"""``runner check-archive``: verify a run's archive offline, trusting nothing but the operator's
public key (the one in the archive, or one the reviewer pins).

The links, checked in this order; the first that does not hold is the verdict:

0. the manifest's signature verifies with the operator's public key (the pinned one, or the
   one the manifest names) before any other member is read, and the archive is in the gzip
   and tar subset ``runner archive`` writes, read by runner.archive.tar_format alone (what
   another reader finds in it is what the check read) within what the signed manifest lists
   (runner.archive.tarball.unpack): no unsigned byte costs more than its size;
1. the credential scan over the archive's bytes and its members finds nothing, inflating at
   most ``MAX_SCAN_INFLATED_BYTES`` for the whole archive;
2. the receipt's signature verifies with the same key, the archive's key file is that key;
3. every member is in the manifest with its sha256, and every file the manifest keeps is there;
4. the ledger's hash chain links every line, from the run's seed to the receipt's head;
5. the ledger has each scheduled cell once, on the attempt its records say finished (the
   interrupted and retried attempts kept apart, under attempts/), in the schedule's order
   (every cell of a serial run; each batch's own cells of a batch-per-host run);
6. every file a ledger line names has the sha256 the line records;
7. every outcome agrees with its own trial's evidence, read as the cell runner read it
   (runner.cells.classify);
8. the receipt, its status included, and the report's tables recompute from the run's files.
   When the receipt's judge names other versions of Python, scipy or numpy than the check runs
   under, the statistics they compute (each batch's ``stats`` and ``comparisons``) may differ
   in their numbers and words alone: every count, key and length must still recompute, the
   rest of the receipt must recompute exactly, and report.md must be the rendering of the
   receipt's own statistics; the verdict names the versions and report.md's lines that differ.

A verifier_setup verdict is re-judged from the trial and the cell's own lines of the mirror log
(mirror/<cell>.jsonl); an unjudged one from the freeze manifest the run kept (freeze.json,
which must be the one the final verify audited): its oracle of the task must not have scored 1.

An outcome whose trial has a file kept by digest only (allowed only for a bulky file over the
manifest's size limit), or an unjudged verdict without a freeze manifest, is not re-judged:
the verdict names each such cell and why (``Verdict.not_rejudged``).

Not checked (the archive cannot show them): that the guest ran what the freeze recorded
(the final verify's report is evidence, not a re-run), and secrets other than the bearer shape
(the real key and the issued bearers never leave the controller).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from runner.archive.tarball import (
    MANIFEST,
    MANIFEST_SIGNATURE,
    ArchivedFile,
    ArchiveManifest,
    archive_finding,
    digest_only_problem,
    read_manifest,
    unpack,
)
from runner.cells.accounting import agent_cgroup_in
from runner.cells.cell import OverruledBy, no_model_request
from runner.cells.classify import DEADLINE_REASON, classify
from runner.cells.verifier_setup import verifier_setup_problem
from runner.core.archives import UnsafeArchive
from runner.core.canonical import file_digest
from runner.core.errors import InputError, RunnerError
from runner.core.files import read_model
from runner.core.models import updated
from runner.freeze.manifest import FreezeManifest
from runner.lab.harbor_result import HarborTrialResult
from runner.lab.mirror import MirrorRequest
from runner.proxy import ProxyCellCounts
from runner.records.ledger import Ledger, LedgerChain, LedgerLine, Outcome, chain_seed, check_chain
from runner.records.paths import RunPaths
from runner.records.schedule import Schedule
from runner.report.evidence import load_run
from runner.report.judge import Judge, running_versions
from runner.report.markdown import markdown
from runner.report.receipt import BatchReceipt, Receipt, Status
from runner.report.signing import PublicKey, verify
from runner.report.write import report_blocks
from runner.spec.lock import Placement

# What the cell runner may have overruled, by what the trial says (runner/cells/cell.py).
_OVERRULED: dict[Outcome, tuple[OverruledBy, ...]] = {
    "pass": (OverruledBy.ENDED_EARLY, OverruledBy.NO_MODEL_REQUEST, OverruledBy.UNJUDGED),
    "fail": (
        OverruledBy.ENDED_EARLY,
        OverruledBy.VERIFIER_SETUP,
        OverruledBy.NO_MODEL_REQUEST,
        OverruledBy.UNJUDGED,
    ),
    "indeterminate": (),
}


class ArchiveBroken(RunnerError):
    """A link of the archive's evidence does not hold."""


# A batch's fields that scipy and numpy compute (runner.report.analysis): what other versions of
# them may change.
COMPUTED_FIELDS = ("stats", "comparisons")
SHOWN_LINES = 10  # of report.md's differing lines, the numbers the verdict names


@dataclass(frozen=True)
class OtherVersions:
    """The report recomputed under other versions than the receipt's judge names."""

    versions: tuple[str, ...]  # e.g. "scipy 1.16.1 (receipt 1.15.3)"
    report_lines: tuple[int, ...]  # report.md's lines the running versions render otherwise

    @property
    def line(self) -> str:
        numbers = ", ".join(str(n) for n in self.report_lines[:SHOWN_LINES])
        hidden = len(self.report_lines) - SHOWN_LINES
        more = f" and {hidden} more" if hidden > 0 else ""
        differ = (
            f"report.md lines {numbers}{more} differ (statistics rendered from the receipt)"
            if self.report_lines
            else "report.md recomputes the same"
        )
        return f"recomputed under other versions: {', '.join(self.versions)}; {differ}"


@dataclass(frozen=True)
class Verdict:
    run: str
    cells: int
    status: Status
    chain: LedgerChain
    signed_by: PublicKey
    digest_only: int
    # (cell, why) for each outcome the check could not re-judge from its trial's evidence.
    not_rejudged: tuple[tuple[str, str], ...] = ()
    pinned: bool = True  # False: the signer is the archive's own key, trusted as asked
    other_versions: OtherVersions | None = None

    def lines(self, accept_not_rejudged: bool) -> list[str]:
        """What check-archive prints: each outcome not re-judged, then the verdict line. An
        outcome taken on the operator's word alone is no intact archive unless accepted."""
        named = [f"  not re-judged: {cell}: {why}" for cell, why in self.not_rejudged]
        unjudged = len(self.not_rejudged)
        if unjudged and not accept_not_rejudged:
            verdict = (
                f"archive NOT RE-JUDGED: {unjudged} outcomes not re-judged (named above; "
                f"--accept-digest-only accepts them), the rest intact: "
            )
        else:
            verdict = "archive intact: "
        versions = [self.other_versions.line] if self.other_versions else []
        return [*named, *versions, verdict + self._facts(accept_not_rejudged)]

    def _facts(self, accepted: bool) -> str:
        unjudged = len(self.not_rejudged)
        return (
            f"run {self.run}, {self.cells} cells, receipt {self.status}, "
            f"ledger chain {self.chain.state} (head {self.chain.head}), "
            f"{self.digest_only} files kept by digest only"
            + (f" ({unjudged} outcomes not re-judged, accepted)" if unjudged and accepted else "")
            + f", signed by {self.signed_by.fingerprint} ({self.signed_by.comment or 'no comment'})"
            + ("" if self.pinned else ", signer UNPINNED")
        )


def check_archive(archive: Path, pinned_key: PublicKey | None) -> Verdict:
    """Every link above, or ``ArchiveBroken`` naming the first that does not hold (a member
    that is no plain file or a malformed record is a broken link too)."""
    try:
        return _checked(archive, pinned_key)
    except (InputError, UnsafeArchive) as error:
        raise ArchiveBroken(str(error)) from None


def _checked(archive: Path, pinned_key: PublicKey | None) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="frozen-bench-check-") as scratch:
        tree = Path(scratch)
        paths = RunPaths(tree / unpack(archive, tree, pinned_key))
        check_scan(archive, tree)
        manifest = read_manifest(paths.run_dir)
        check_digest_only(manifest)
        public_key = check_signatures(paths, manifest, pinned_key)
        check_members(paths, manifest)
        receipt = read_model(paths.receipt, Receipt)
        chain = check_ledger_chain(paths, receipt)
        lines = Ledger(paths).lines()
        check_schedule(paths, lines, receipt)
        check_artifacts(lines, manifest)
        freeze = check_freeze_manifest(paths, receipt)
        not_rejudged = []
        for line in lines:
            if not digest_only_trial(line, manifest):  # its trial's evidence is all here
                check_outcome(paths, line, freeze)
            why = unjudgeable(line, manifest, freeze)
            if why is not None:
                not_rejudged.append((line.cell_id, why))
        other_versions = check_recomputed(paths, receipt, manifest.signed_by)
        return Verdict(
            run=manifest.run,
            cells=len(lines),
            status=receipt.status,
            chain=chain,
            signed_by=public_key,
            pinned=pinned_key is not None,
            digest_only=sum(not entry.kept for entry in manifest.files),
            not_rejudged=tuple(not_rejudged),
            other_versions=other_versions,
        )


def check_digest_only(manifest: ArchiveManifest) -> None:
    for entry in manifest.files:
        problem = digest_only_problem(entry, manifest.size_limit)
        if problem is not None:
            raise ArchiveBroken(problem)


def check_scan(archive: Path, tree: Path) -> None:
    finding = archive_finding(archive, tree)
    if finding is not None:
        raise ArchiveBroken(f"credential scan: {finding}")


def check_signatures(
    paths: RunPaths, manifest: ArchiveManifest, pinned_key: PublicKey | None
) -> PublicKey:
    """The operator's public key, once the receipt's signature verifies with it and with it
    alone (the archive's key file must be one key; with ``pinned_key`` it must be that key),
    and it is the key the manifest was signed by (``unpack`` verified that signature)."""
    for required in (paths.receipt_public_key, paths.receipt_signature, paths.receipt):
        if not required.is_file():
            raise ArchiveBroken(f"{required.name}: missing from the archive")
    name = paths.receipt_public_key.name
    public_key = PublicKey.parse(paths.receipt_public_key.read_text(errors="replace"), name)
    if pinned_key is not None and not pinned_key.same_key(public_key):
        raise ArchiveBroken(
            f"{name}: {public_key.fingerprint} is not the key given with --key "
            f"({pinned_key.fingerprint})"
        )
    if not PublicKey.parse(manifest.signed_by, f"{MANIFEST} signed_by").same_key(public_key):
        raise ArchiveBroken(f"{MANIFEST}: signed_by is not {name}")
    problem = verify(paths.receipt.read_bytes(), paths.receipt_signature.read_bytes(), public_key)
    if problem is not None:
        raise ArchiveBroken(
            f"{paths.receipt_signature.name}: not the operator's signature of "
            f"{paths.receipt.name} ({problem})"
        )
    return public_key


def check_members(paths: RunPaths, manifest: ArchiveManifest) -> None:
    present = {
        path.relative_to(paths.run_dir).as_posix()
        for path in paths.run_dir.rglob("*")
        if path.is_file()
    } - {MANIFEST, MANIFEST_SIGNATURE}
    for entry in manifest.files:
        if not entry.kept:
            continue
        if entry.path not in present:
            raise ArchiveBroken(f"{entry.path}: in the manifest, missing from the archive")
        if file_digest(paths.run_dir / entry.path) != entry.sha256:
            raise ArchiveBroken(f"{entry.path}: not the sha256 the manifest records")
        present.discard(entry.path)
    if present:
        raise ArchiveBroken(f"{sorted(present)[0]}: in the archive, not in the manifest")


def check_ledger_chain(paths: RunPaths, receipt: Receipt) -> LedgerChain:
    schedule = read_model(paths.schedule, Schedule)
    ledger = paths.ledger.read_bytes() if paths.ledger.exists() else b""
    chain = check_chain(ledger, chain_seed(schedule))
    if chain.broken_at is not None:
        raise ArchiveBroken(f"ledger chain: {chain.broken_at}")
    recorded = receipt.ledger_chain
    if recorded is not None and recorded.head != chain.head:
        raise ArchiveBroken(
            f"ledger chain: the receipt's head is not cells.jsonl's last line "
            f"({recorded.lines} lines signed, {chain.lines} in the ledger: its end was cut, "
            "added to or edited)"
        )
    return chain


def check_schedule(paths: RunPaths, lines: list[LedgerLine], receipt: Receipt) -> None:
    schedule = read_model(paths.schedule, Schedule)
    if receipt.identities.schedule_sha256 != schedule.sha256:
        raise ArchiveBroken("schedule.json: not the schedule the receipt names")
    scheduled = {cell.id for cell in schedule.cells}
    for line in lines:
        if line.cell_id not in scheduled:
            raise ArchiveBroken(f"cells.jsonl: {line.cell_id} is not in the schedule")
        check_attempts(paths, line)
    missing = scheduled - {line.cell_id for line in lines}
    if missing and receipt.status != "failed_closed":
        raise ArchiveBroken(f"cells.jsonl: no line for {sorted(missing)[0]}, receipt not failed")
    held = receipt.placement.held if receipt.placement is not None else "serial"
    check_order(schedule, lines, held)


def check_order(schedule: Schedule, lines: list[LedgerLine], held: Placement) -> None:
    """Cells run one at a time in schedule order: on one lab every cell (serial), on a fleet
    each batch's own (batch-per-host). A line recorded before one the schedule puts ahead of
    it is an order the run did not have (lines swapped, then linked afresh by a key holder)."""
    order = {cell.id: index for index, cell in enumerate(schedule.cells)}
    last: dict[str, LedgerLine] = {}
    for line in lines:
        group = "run" if held == "serial" else line.batch
        before = last.get(group)
        if before is not None and order[line.cell_id] < order[before.cell_id]:
            raise ArchiveBroken(
                f"cells.jsonl: {line.cell_id} is recorded after {before.cell_id}, which the "
                f"schedule runs after it ({held})"
            )
        last[group] = line


def check_attempts(paths: RunPaths, line: LedgerLine) -> None:
    """The line is its cell's last attempt; every other attempt was interrupted or retried."""
    records = Ledger(paths).attempts(line.cell_id)
    status = {record.attempt: record.status for record in records}
    own = status.pop(line.attempt, None)
    # started: the runner was killed between the line's fsync and its record's update.
    if own not in ("finished", "started"):
        raise ArchiveBroken(
            f"attempts/{line.cell_id}: the ledger's attempt {line.attempt} is "
            f"{own or 'not recorded'}"
        )
    apart = ("interrupted", "retried")
    other = next((n for n, s in sorted(status.items()) if s not in apart), None)
    if other is not None:
        raise ArchiveBroken(
            f"attempts/{line.cell_id}: attempt {other} is {status[other]}, but the ledger's "
            f"is {line.attempt}"
        )
    retried = sum(record.status == "retried" for record in records)
    if retried != line.retried_attempts:
        raise ArchiveBroken(
            f"attempts/{line.cell_id}: {retried} retried attempts, the ledger says "
            f"{line.retried_attempts}"
        )


def check_artifacts(lines: list[LedgerLine], manifest: ArchiveManifest) -> None:
    for line in lines:
        for artifact in line.artifacts:
            entry = manifest.file(artifact.path)
            if entry is None or entry.sha256 != artifact.sha256:
                raise ArchiveBroken(
                    f"{artifact.path}: not the sha256 its ledger line ({line.cell_id}) records"
                )


def digest_only_trial(line: LedgerLine, manifest: ArchiveManifest) -> list[ArchivedFile]:
    """The files of the cell's trial the archive keeps by digest only."""
    trial = f"trials/{line.cell_id}/"
    entries = (manifest.file(a.path) for a in line.artifacts if a.path.startswith(trial))
    return [entry for entry in entries if entry is not None and not entry.kept]


def unjudgeable(
    line: LedgerLine, manifest: ArchiveManifest, freeze: FreezeManifest | None
) -> str | None:
    """Why the cell's outcome cannot be re-judged from the archive (None: it can): a file of
    its trial kept by digest only, or an unjudged verdict of a run that kept no freeze
    manifest (a fleet run, an older run), whose oracle alone could judge it."""
    missing = digest_only_trial(line, manifest)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return (
            f"{missing[0].path} ({missing[0].size} B){more} kept by digest only, over the "
            f"{manifest.size_limit} B size limit"
        )
    if freeze is None and line.reason.startswith(f"{OverruledBy.UNJUDGED}:"):
        return "an unjudged verdict, and the run kept no freeze manifest whose oracle judges it"
    return None


def check_freeze_manifest(paths: RunPaths, receipt: Receipt) -> FreezeManifest | None:
    """freeze.json, when the run kept one, must be the freeze its final verify audited."""
    if not paths.freeze_manifest.is_file():
        return None
    freeze = read_model(paths.freeze_manifest, FreezeManifest)
    audited = receipt.frozen.freeze_manifest_sha256 if receipt.frozen else None
    if audited is not None and freeze.sha256 != audited:
        raise ArchiveBroken(
            f"freeze.json: its sha256 is {freeze.sha256}, the final verify audited {audited}"
        )
    return freeze


def check_outcome(paths: RunPaths, line: LedgerLine, freeze: FreezeManifest | None) -> None:
    deadline = line.reason.startswith(DEADLINE_REASON)
    expected, why, harbor = classify(paths.trial(line.cell_id), deadline)
    if line.outcome == expected:
        return
    overruled = next((o for o in _OVERRULED[expected] if line.reason.startswith(f"{o}:")), None)
    if line.outcome != "indeterminate" or overruled is None:
        raise ArchiveBroken(
            f"cells.jsonl: {line.cell_id} says {line.outcome}, its trial says {expected} ({why})"
        )
    if overruled == OverruledBy.ENDED_EARLY and not _failure_kept(paths, line):
        raise ArchiveBroken(
            f"attempts/{line.cell_id}: the line says it ended early, its attempt record "
            "keeps no exception"
        )
    if overruled == OverruledBy.VERIFIER_SETUP:
        problem = verifier_setup_problem(paths.trial(line.cell_id), harbor, _requests(paths, line))
        if line.reason != f"{OverruledBy.VERIFIER_SETUP}: {problem}":
            raise ArchiveBroken(
                f"cells.jsonl: {line.cell_id} says {line.reason!r}, its trial and mirror log "
                f"say {problem or 'the verifier set up'}"
            )
    if overruled == OverruledBy.NO_MODEL_REQUEST:
        silent = _no_model_request(paths, line, harbor)
        if line.reason != f"{OverruledBy.NO_MODEL_REQUEST}: {silent}":
            raise ArchiveBroken(
                f"cells.jsonl: {line.cell_id} says {line.reason!r}, its trial and proxy record "
                f"say {silent or 'the harness asked its model or ended well'}"
            )
    if overruled == OverruledBy.UNJUDGED and freeze is not None:
        score = next((score for score in freeze.oracle if score.task == line.task), None)
        if score is None or score.judges:
            said = f"scored {score.reward:g}" if score else "did not run"
            raise ArchiveBroken(
                f"cells.jsonl: {line.cell_id} says task {line.task} is unjudged, the freeze "
                f"manifest's oracle of it {said}"
            )


def _no_model_request(
    paths: RunPaths, line: LedgerLine, harbor: HarborTrialResult | None
) -> str | None:
    counts_path = paths.proxy_counts(line.cell_id)
    counts = read_model(counts_path, ProxyCellCounts) if counts_path.is_file() else None
    return no_model_request(counts, harbor, agent_cgroup_in(paths.trial(line.cell_id)))


def _requests(paths: RunPaths, line: LedgerLine) -> tuple[MirrorRequest, ...]:
    path = paths.cell_mirror(line.cell_id)
    if not path.is_file():
        return ()
    return tuple(MirrorRequest.model_validate_json(text) for text in path.read_text().splitlines())


def _failure_kept(paths: RunPaths, line: LedgerLine) -> bool:
    records = Ledger(paths).attempts(line.cell_id)
    return any(r.attempt == line.attempt and r.failure is not None for r in records)


def check_recomputed(paths: RunPaths, receipt: Receipt, public_key: str) -> OtherVersions | None:
    """The receipt and report.md recompute; under other versions than the receipt's judge
    names, up to what those compute (the module's link 8)."""
    judge = receipt.identities.judge
    recomputed = load_run(paths, signed_by=public_key, judge=judge)
    if recomputed.status != receipt.status:
        reasons = "; ".join(recomputed.reasons) or "no reason to fail"
        raise ArchiveBroken(
            f"receipt.json: status {receipt.status}, the evidence gives {recomputed.status} "
            f"({reasons})"
        )
    versions = other_versions(judge)
    as_signed = with_signed_statistics(recomputed, receipt) if versions else recomputed
    signed = receipt.model_dump(mode="json", by_alias=True)
    derived = as_signed.model_dump(mode="json", by_alias=True)
    differing = sorted(
        key for key in signed.keys() | derived.keys() if signed.get(key) != derived.get(key)
    )
    if differing:
        raise ArchiveBroken(f"receipt.json: {differing[0]} does not recompute from the run's files")
    # Rendered from the recomputed receipt: its dicts keep the lock's order, as the report did.
    report = paths.report_md.read_text()
    if markdown(report_blocks(paths, as_signed)) != report:
        raise ArchiveBroken("report.md: its tables do not recompute from the ledger")
    if not versions:
        return None
    fresh = markdown(report_blocks(paths, recomputed)).splitlines()
    lines = zip_longest(report.splitlines(), fresh)
    return OtherVersions(versions, tuple(n for n, (a, b) in enumerate(lines, 1) if a != b))


def other_versions(judge: Judge | None) -> tuple[str, ...]:
    """Each version the statistics depend on that differs here from the receipt's judge, as
    "scipy 1.16.1 (receipt 1.15.3)"; none for a receipt written before it named its judge."""
    if judge is None:
        return ()
    running = running_versions()
    return tuple(
        f"{name} {running[name]} (receipt {version})"
        for name, version in judge.computing_versions().items()
        if running[name] != version
    )


def with_signed_statistics(recomputed: Receipt, signed: Receipt) -> Receipt:
    """``recomputed`` with the numbers and words of each batch's computed fields as ``signed``
    has them, when the two differ in nothing else; else ``recomputed`` as it is (and the
    comparison with the signed receipt names what differs)."""
    if len(recomputed.batches) != len(signed.batches):
        return recomputed
    batches = []
    for mine, theirs in zip(recomputed.batches, signed.batches, strict=True):
        derived = mine.model_dump(mode="json", by_alias=True)
        kept = theirs.model_dump(mode="json", by_alias=True)
        try:
            derived.update({f: signed_leaves(kept[f], derived[f]) for f in COMPUTED_FIELDS})
        except NotAlike:
            return recomputed
        batches.append(BatchReceipt.model_validate(derived))
    return updated(recomputed, batches=tuple(batches))


class NotAlike(Exception):
    """Two computed fields differ in more than what other versions compute."""


def signed_leaves(signed: object, derived: object) -> object:
    """``derived`` with ``signed``'s numbers (floats) and words (a verdict that follows a
    p-value), its dicts in their order (the report's order; a receipt read back has its keys
    sorted). ``NotAlike`` unless both have the same shape (keys, lengths, None or not), counts
    (ints) and flags."""
    if isinstance(signed, dict) and isinstance(derived, dict):
        if signed.keys() != derived.keys():
            raise NotAlike
        return {key: signed_leaves(signed[key], value) for key, value in derived.items()}
    if isinstance(signed, list) and isinstance(derived, list):
        if len(signed) != len(derived):
            raise NotAlike
        return [signed_leaves(*pair) for pair in zip(signed, derived, strict=True)]
    if type(signed) is type(derived) and isinstance(signed, float | str):
        return signed
    if signed != derived:
        raise NotAlike
    return derived
