"""The ledger: ``cells.jsonl``, one validated line per finished cell, append-only.

Each line is flushed and fsynced before the next cell starts. Every attempt leaves a record
under ``attempts/`` before it starts, so a runner killed mid-cell leaves evidence: on resume the
interrupted attempt is marked as such and kept, and the cell is run again as a new attempt,
never counted as a second sample. An attempt the lock's retry policy re-runs is kept the same
way (``set_aside``: its trial tree, proxy record and would-be line under
``attempts/<cell>/attempt-<n>/``): the ledger holds one line per cell, its final attempt's.

The ledger is hash-chained: each line carries ``previous_sha256``, the sha256 of the previous
line's bytes (the first line: of the chain's seed, the run's lock fingerprint and schedule
sha256), so a line edited, removed or moved breaks the chain at the line after it; the last
line's digest, the chain's head, goes into the signed receipt. Lines written before the chain
existed have no ``previous_sha256``: such a ledger is reported "unchained", not broken.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Literal, TypedDict

from pydantic import ConfigDict, Field, ValidationError, model_validator

from runner.core.canonical import canonical_json, file_digest, sha256_digest
from runner.core.errors import InputError, RunnerError, describe_validation_error
from runner.core.files import read_model, write_model
from runner.core.models import FailureClass, FrozenModel, Sha256, updated
from runner.guest.agent_plan import CompiledCacheReading
from runner.guest.warm_harbor import HarborProcess
from runner.lab.egress import RefusedEgress
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.schedule import Cell, Schedule
from runner.spec.seeded import SeededDraws

Outcome = Literal["pass", "fail", "indeterminate"]


class RetainedFile(FrozenModel):
    """A file a cell left in the run directory (trial tree, proxy counts), with its digest."""

    path: str  # relative to the run directory
    sha256: Sha256


class RequestSums(FrozenModel):
    """One cell's request log summed (the proxy record has each request). Provider-reported:
    the tokens, each summed over the answers that carried the field, None when none did ("not
    returned", never 0). Measured by the proxy: bytes and latency over every physical POST."""

    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    cache_read_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    reasoning_tokens: int | None = Field(default=None, ge=0)
    answers_with_usage: int = Field(ge=0, description="2xx answers that carried usage")
    request_bytes: int = Field(ge=0)
    response_bytes: int = Field(ge=0)
    latency_ms: float = Field(ge=0, description="the physical POSTs' durations, summed")


class MirrorUse(FrozenModel):
    """What the cell asked of the lab's package mirror (runner.lab.mirror): every request, and
    each package or project it asked for that the frozen set does not have."""

    requests: int = Field(ge=0)
    misses: tuple[str, ...] = ()


class LedgerLine(FrozenModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    # Left out of a line at their default (None: "not recorded"), so lines keep their shape.
    LATE_FIELDS = frozenset(
        {
            "request_sums",
            "agent_cpu_seconds",
            "agent_peak_memory_bytes",
            "mirror",
            "egress_refused",
            "harbor_process",
            "previous_sha256",
            "host",
            "unsent_posts",
            "trial_outcome",
            "stand_in",
            "time_to_first_request_seconds",
            "agent_after_first_request_seconds",
            "compiled_cache",
        }
    )

    schema_version: Literal[1] = 1
    cell_id: str
    batch: str
    model: str
    task: str
    repeat: int = Field(ge=1)
    harness: str
    attempt: int = Field(ge=1)
    outcome: Outcome
    reason: str = Field(min_length=1)
    started_at: datetime
    ended_at: datetime
    wall_seconds: float = Field(ge=0)
    provider_tokens: int | None = Field(ge=0)
    physical_posts: int = Field(ge=0)
    logical_attempts: int = Field(ge=0)
    unattributed_provider_post_requests: int = Field(ge=0, alias="unattributedProviderPostRequests")
    # POSTs the proxy could not send (no connection to the provider); 0 in older lines.
    unsent_posts: int = Field(default=0, ge=0)
    artifacts: tuple[RetainedFile, ...] = ()
    # Seconds per phase of the cell (reset, bearer, harbor, copy_back, ..., agent, verifier):
    # what lies outside the agent and the verifier is the runner's overhead.
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    # Optional, so lines written before they existed still load: None is "not recorded".
    failure_class: FailureClass | None = None
    retried_attempts: int = Field(
        default=0, ge=0, description="earlier attempts of the cell re-run by the retry policy"
    )
    # The proxy's view of the cell's first provider request (None in older lines, or no request).
    first_request: PromptFootprint | None = None
    request_sums: RequestSums | None = None
    agent_cpu_seconds: float | None = Field(
        default=None, ge=0, description="the agent container's CPU time up to the harness's end"
    )
    agent_peak_memory_bytes: int | None = Field(
        default=None, ge=0, description="the agent container's peak memory up to the harness's end"
    )
    mirror: MirrorUse | None = None
    # What the guest's egress firewall refused during the cell (runner.lab.egress): evidence of
    # hermeticity, not a verdict. () nothing was refused; None not recorded (older lines, a cell
    # that ended before the read, a guest whose firewall could not be read).
    egress_refused: tuple[RefusedEgress, ...] | None = None
    # Harbor as the cell ran it: the warm process the freeze left (runner/guest/warm_harbor.py)
    # or a cold start (a guest without one waiting). None: not recorded.
    harbor_process: HarborProcess | None = None
    # The sha256 of the previous line's bytes, or of the chain's seed (``chain_seed``) for the
    # first line. None: a line written before the chain (or in a directory without a schedule).
    previous_sha256: Sha256 | None = None
    # The fleet host whose lab ran the cell (runner.fleet); None: the run's one lab.
    host: str | None = None
    # What the trial itself said when the runner overruled it as unjudged (its task's oracle did
    # not score 1 at the freeze). None: not overruled, or a line from before it was kept, when
    # only a fail was overruled.
    trial_outcome: Outcome | None = None
    # What the seeded stand-in model drew for the cell (runner.spec.seeded): a reviewer
    # recomputes it from the lock's model and the cell id. None: another model, or older lines.
    stand_in: SeededDraws | None = None
    # Start-up apart from work: from the start of Harbor's agent phase (the guest's clock, set
    # from the host's at every reset) to the first model request the proxy logged (the host's
    # clock), and from that request to the agent phase's end. None: not recorded (no request,
    # no agent phase, or older lines).
    time_to_first_request_seconds: float | None = None
    agent_after_first_request_seconds: float | None = None
    # The harness's compiled cache (jiti's) just before and after it ran in the cell: whether
    # it was warm (runner.guest.agent_plan.CompiledCacheReading). None: not recorded.
    compiled_cache: CompiledCacheReading | None = None

    @model_validator(mode="after")
    def _unattributed_matches_counts(self) -> LedgerLine:
        expected = unattributed_provider_post_requests(self.physical_posts, self.logical_attempts)
        if self.unattributed_provider_post_requests != expected:
            raise ValueError(
                f"unattributedProviderPostRequests must be physical_posts - logical_attempts "
                f"when positive, else 0 (expected {expected})"
            )
        return self

    @property
    def reconciles(self) -> bool:
        """Every logical attempt needs at least one POST the proxy saw, sent on or not (a
        harness's attempt ends in an error when the provider cannot be reached); fewer means
        lost evidence."""
        return self.physical_posts + self.unsent_posts >= self.logical_attempts


ChainState = Literal["intact", "unchained", "broken"]


class LedgerChain(FrozenModel):
    """What the ledger's hash chain says: ``intact`` (every line links to the one before),
    ``unchained`` (some lines were written before the chain; none contradicts it) or ``broken``
    (``broken_at`` names the first line that does not link)."""

    state: ChainState
    seed: Sha256
    head: Sha256 = Field(description="the last line's sha256 (the seed for an empty ledger)")
    lines: int = Field(ge=0)
    broken_at: str | None = None


def chain_seed(schedule: Schedule) -> str:
    """The first link: the run's lock fingerprint and schedule sha256, as canonical JSON."""
    seed = {"lock_fingerprint": schedule.lock_fingerprint, "schedule_sha256": schedule.sha256}
    return sha256_digest(canonical_json(seed))


def check_chain(ledger_bytes: bytes, seed: str) -> LedgerChain:
    """Follow the chain over the ledger's raw lines (their bytes, not a re-serialization)."""
    raw_lines = ledger_bytes.splitlines()
    expected = seed
    unchained = False
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = LedgerLine.model_validate_json(raw)
        except ValidationError as error:
            broken = describe_validation_error(f"cells.jsonl line {number}", error)
            return LedgerChain(
                state="broken", seed=seed, head=expected, lines=len(raw_lines), broken_at=broken
            )
        if line.previous_sha256 is None:
            unchained = True
        elif line.previous_sha256 != expected:
            what = "the chain's seed" if number == 1 else f"line {number - 1}'s sha256"
            broken = f"cells.jsonl line {number} ({line.cell_id}): previous_sha256 is not {what}"
            return LedgerChain(
                state="broken", seed=seed, head=expected, lines=len(raw_lines), broken_at=broken
            )
        expected = sha256_digest(raw)
    state: ChainState = "unchained" if unchained else "intact"
    return LedgerChain(state=state, seed=seed, head=expected, lines=len(raw_lines))


class CellCoordinates(TypedDict):
    cell_id: str
    batch: str
    model: str
    task: str
    repeat: int
    harness: str


def cell_coordinates(cell: Cell) -> CellCoordinates:
    """The fields of a ledger line that say which cell of the schedule it is."""
    return {
        "cell_id": cell.id,
        "batch": cell.batch,
        "model": cell.model,
        "task": cell.task,
        "repeat": cell.repeat,
        "harness": cell.harness,
    }


def unattributed_provider_post_requests(physical_posts: int, logical_attempts: int) -> int:
    """Physical POSTs beyond the logical attempts (client retries, requests of the harness's
    own): the one place this count is made; fewer POSTs than attempts are lost evidence, not a
    negative count."""
    return max(0, physical_posts - logical_attempts)


class Failure(FrozenModel):
    """An exception that ended a cell or a run early: which, and in which phase."""

    phase: str
    exception_type: str
    message: str

    @classmethod
    def of(cls, error: BaseException, phase: str) -> Failure:
        return cls(phase=phase, exception_type=type(error).__name__, message=str(error))

    @property
    def line(self) -> str:
        return f"{self.exception_type} in {self.phase}: {self.message}"


class AttemptRecord(FrozenModel):
    cell_id: str
    attempt: int = Field(ge=1)
    status: Literal["started", "finished", "interrupted", "retried"]
    started_at: datetime
    interrupted_noted_at: datetime | None = None
    # Optional, so attempt records written before they existed still load.
    failure: Failure | None = None
    failure_class: FailureClass | None = None
    # The digest of the bearer the proxy issued the attempt (never the bearer): the guest scan
    # expects that bearer, and only it, in Podman's records of the cell's exec, also when it
    # is a resumed run scanning the disk of a killed runner, which never knew the bearer.
    bearer_sha256: Sha256 | None = None
    # The phase the attempt is in (runner.core.timing.PhaseTimer), rewritten as each one starts:
    # what an observer of a running cell waits on (a test's kill inside Harbor, an operator).
    phase: str | None = None


def now() -> datetime:
    return datetime.now(UTC)


class Ledger:
    """Reads and appends ``cells.jsonl`` and the attempt records of one run directory."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths

    def lines(self) -> list[LedgerLine]:
        if not self.paths.ledger.exists():
            return []
        text = self.paths.ledger.read_text()
        lines = []
        seen: set[str] = set()
        for number, raw in enumerate(text.splitlines(), start=1):
            try:
                line = LedgerLine.model_validate_json(raw)
            except ValidationError as error:
                where = f"{self.paths.ledger}:{number}"
                raise InputError(describe_validation_error(where, error)) from None
            if line.cell_id in seen:
                raise InputError(
                    f"{self.paths.ledger}:{number}: cell {line.cell_id} recorded twice"
                )
            seen.add(line.cell_id)
            lines.append(line)
        return lines

    def repair_torn_tail(self) -> bool:
        """A kill during a write can leave a last line without its newline: that cell did not
        finish. Move the fragment to ``attempts/`` as evidence; the cell runs again."""
        if not self.paths.ledger.exists():
            return False
        data = self.paths.ledger.read_bytes()
        if not data or data.endswith(b"\n"):
            return False
        keep = data[: data.rfind(b"\n") + 1]
        fragment = self.paths.torn_ledger_tail(now().strftime("%Y%m%dT%H%M%S%fZ"))
        fragment.parent.mkdir(parents=True, exist_ok=True)
        fragment.write_bytes(data[len(keep) :])
        with self.paths.ledger.open("r+b") as handle:
            handle.truncate(len(keep))
            os.fsync(handle.fileno())
        return True

    def append(self, line: LedgerLine) -> LedgerLine:
        """Append the line, linked to the one before it; returns it as written."""
        if line.cell_id in {recorded.cell_id for recorded in self.lines()}:
            raise RunnerError(
                f"cell {line.cell_id} is already in the ledger; not counting it twice"
            )
        line = updated(line, previous_sha256=self._next_link())
        payload = line.model_dump_json(by_alias=True) + "\n"
        self.paths.ledger.parent.mkdir(parents=True, exist_ok=True)
        with self.paths.ledger.open("a") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        return line

    def _next_link(self) -> str | None:
        """The sha256 the next line links to: the last line's bytes, else the chain's seed
        (None without a schedule to seed it, as in a directory made by hand)."""
        data = self.paths.ledger.read_bytes() if self.paths.ledger.exists() else b""
        if data:
            return sha256_digest(data.splitlines()[-1])
        if not self.paths.schedule.exists():
            return None
        return chain_seed(read_model(self.paths.schedule, Schedule))

    def chain(self) -> LedgerChain | None:
        """The ledger's chain as it stands (None without a schedule to seed it)."""
        if not self.paths.schedule.exists():
            return None
        data = self.paths.ledger.read_bytes() if self.paths.ledger.exists() else b""
        return check_chain(data, chain_seed(read_model(self.paths.schedule, Schedule)))

    def finish(self, line: LedgerLine) -> LedgerLine:
        """Append the cell's line, then mark its attempt record finished; the line as written."""
        written = self.append(line)
        self._mark(written, "finished")
        return written

    def _mark(self, line: LedgerLine, status: Literal["finished", "retried"]) -> None:
        path = self.paths.attempt(line.cell_id, line.attempt)
        if path.exists():
            record = read_model(path, AttemptRecord)
            write_model(path, updated(record, status=status, failure_class=line.failure_class))

    def set_aside(self, line: LedgerLine) -> LedgerLine:
        """Keep an attempt the retry policy re-runs as evidence, out of the ledger: its trial
        tree and proxy record move under ``attempts/<cell>/attempt-<n>/`` beside the line it
        would have had (its artifacts at their new paths); its record is marked retried."""
        directory = self.paths.retried_attempt(line.cell_id, line.attempt)
        moves = {
            self.paths.trial(line.cell_id): directory / "trial",
            self.paths.proxy_counts(line.cell_id): directory / "proxy.json",
            self.paths.cell_mirror(line.cell_id): directory / "mirror.jsonl",
        }
        directory.mkdir(parents=True, exist_ok=True)
        for source, target in moves.items():
            if source.exists():
                source.rename(target)
        files = sorted(path for path in directory.rglob("*") if path.is_file())
        artifacts = tuple(
            RetainedFile(path=str(path.relative_to(self.paths.run_dir)), sha256=file_digest(path))
            for path in files
        )
        kept = updated(line, artifacts=artifacts)
        write_model(directory / "line.json", kept)
        self._mark(line, "retried")
        return kept

    def retried(self, cell_id: str) -> int:
        """How many attempts of the cell the retry policy has re-run so far."""
        return sum(record.status == "retried" for record in self.attempts(cell_id))

    def note_failure(self, cell_id: str, attempt: int, failure: Failure) -> None:
        """Keep the exception that ended the attempt in its record, before anything else can
        fail: the evidence of what went wrong outlives the ledger line."""
        self._update_attempt(cell_id, attempt, {"failure": failure})

    def note_bearer(self, cell_id: str, attempt: int, bearer: str) -> None:
        """Keep the digest of the attempt's bearer in its record, before the bearer is used."""
        self._update_attempt(cell_id, attempt, {"bearer_sha256": sha256_digest(bearer.encode())})

    def note_phase(self, cell_id: str, attempt: int, phase: str) -> None:
        """Record that the attempt has entered ``phase``."""
        self._update_attempt(cell_id, attempt, {"phase": phase})

    def _update_attempt(self, cell_id: str, attempt: int, update: dict[str, object]) -> None:
        path = self.paths.attempt(cell_id, attempt)
        write_model(path, updated(read_model(path, AttemptRecord), **update))

    def attempts(self, cell_id: str) -> list[AttemptRecord]:
        directory = self.paths.attempts_dir / cell_id
        if not directory.is_dir():
            return []
        records = [read_model(path, AttemptRecord) for path in directory.glob("attempt-*.json")]
        return sorted(records, key=lambda record: record.attempt)

    def begin_attempt(self, cell: Cell) -> AttemptRecord:
        """Mark earlier unfinished attempts as interrupted (kept), then record a new one."""
        previous = self.attempts(cell.id)
        for record in previous:
            if record.status == "started":
                interrupted = updated(
                    record,
                    status="interrupted",
                    interrupted_noted_at=now(),
                    failure_class="cancelled",
                )
                write_model(self.paths.attempt(cell.id, record.attempt), interrupted)
        record = AttemptRecord(
            cell_id=cell.id, attempt=len(previous) + 1, status="started", started_at=now()
        )
        write_model(self.paths.attempt(cell.id, record.attempt), record)
        return record

    def pending(self, cells: tuple[Cell, ...]) -> list[Cell]:
        """Cells without a ledger line, in schedule order."""
        done = {line.cell_id for line in self.lines()}
        return [cell for cell in cells if cell.id not in done]
