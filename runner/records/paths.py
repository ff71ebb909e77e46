"""RunPaths owns a run directory: every file of a run is named here and nowhere else.

<run_dir>/
    lock.toml             the lock exactly as given (bytes)
    resolution.json       the lock's resolution as it was when the run started (bytes)
    schedule.json         canonical JSON of the schedule; its sha256 is the schedule SHA-256
    tasks.json            the tasks as the lab runs them: upstream and derived trees, changes
    freeze.json           the lab's freeze manifest (its oracle scores say which tasks it judges)
    image.json            the manifest of the image the lab was built from (bytes)
    cells.jsonl           the ledger: one validated line per finished cell, append-only
    attempts/<cell>/      attempt-<n>.json per attempt (started, interrupted, retried): evidence
    attempts/<cell>/attempt-<n>/  a retried attempt's trial tree, proxy record and line.json
    attempts/<cell>/guest-scan-<n>.json  the credential scan of the guest's disk after attempt n
    trials/<cell>/        Harbor trial directories copied back from the guest
    proxy/<cell>.json     per-cell physical POST and usage counts (never a key)
    mirror/<cell>.jsonl   the lab's package mirror's log lines of the cell's attempt
    scan.json             credential scan of every retained root
    verify/               frozen-state audits (final.json + ansible-runner artifacts)
    verify/<host>/        a fleet run's audits of each host's lab: <stage>-<batch>.json
    fleet/history/        a fleet run's Temporal workflow histories (credential-scanned)
    fleet/batches/        a fleet run's outcome of each batch's workflow
    aborted.json          why the last execute stopped early (absent when it ran to the end)
    receipt.json          the receipt (status per batch and overall, the ledger's chain head)
    receipt.sig           the lab operator's SSH signature of receipt.json (runner.report.signing)
    receipt-key.pub       the public half of the key that signed it
    report.md, report.png the human report
    report.html           the same report as a static page, readable offline
    report-files/         the page's plots (pass rates, timeline of the cells); it shows
                          report.png too
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    run_dir: Path

    @property
    def lock(self) -> Path:
        return self.run_dir / "lock.toml"

    @property
    def resolution(self) -> Path:
        return self.run_dir / "resolution.json"

    @property
    def schedule(self) -> Path:
        return self.run_dir / "schedule.json"

    @property
    def tasks(self) -> Path:
        return self.run_dir / "tasks.json"

    @property
    def freeze_manifest(self) -> Path:
        return self.run_dir / "freeze.json"

    @property
    def image_manifest(self) -> Path:
        return self.run_dir / "image.json"

    @property
    def ledger(self) -> Path:
        return self.run_dir / "cells.jsonl"

    @property
    def attempts_dir(self) -> Path:
        return self.run_dir / "attempts"

    def attempt(self, cell_id: str, attempt: int) -> Path:
        return self.attempts_dir / cell_id / f"attempt-{attempt}.json"

    def guest_scan(self, cell_id: str, attempt: int) -> Path:
        return self.attempts_dir / cell_id / f"guest-scan-{attempt}.json"

    @property
    def guest_scans(self) -> list[Path]:
        return sorted(self.attempts_dir.glob("*/guest-scan-*.json"))

    def retried_attempt(self, cell_id: str, attempt: int) -> Path:
        return self.attempts_dir / cell_id / f"attempt-{attempt}"

    def torn_ledger_tail(self, stamp: str) -> Path:
        return self.attempts_dir / f"torn-ledger-tail-{stamp}.txt"

    @property
    def trials_dir(self) -> Path:
        return self.run_dir / "trials"

    def trial(self, cell_id: str) -> Path:
        return self.trials_dir / cell_id

    @property
    def proxy_dir(self) -> Path:
        return self.run_dir / "proxy"

    def proxy_counts(self, cell_id: str) -> Path:
        return self.proxy_dir / f"{cell_id}.json"

    def cell_mirror(self, cell_id: str) -> Path:
        return self.run_dir / "mirror" / f"{cell_id}.jsonl"

    @property
    def scan(self) -> Path:
        return self.run_dir / "scan.json"

    @property
    def verify_dir(self) -> Path:
        return self.run_dir / "verify"

    @property
    def final_verify(self) -> Path:
        return self.verify_dir / "final.json"

    def host_verify(self, host: str, stage: str, batch: str) -> Path:
        return self.verify_dir / host / f"{stage}-{batch}.json"

    @property
    def host_final_verifies(self) -> list[Path]:
        return sorted(self.verify_dir.glob("*/final-*.json"))

    @property
    def fleet_dir(self) -> Path:
        return self.run_dir / "fleet"

    @property
    def fleet_run_id(self) -> Path:
        """The run's id in Temporal, made when a fleet first executes it."""
        return self.fleet_dir / "run-id"

    @property
    def controller_lock(self) -> Path:
        """Held (flock) by the one controller of a fleet run: the ledger has one writer."""
        return self.fleet_dir / "controller.lock"

    def fleet_history(self, workflow_id: str) -> Path:
        return self.fleet_dir / "history" / f"{workflow_id}.json"

    def fleet_batch(self, batch: str) -> Path:
        return self.fleet_dir / "batches" / f"{batch}.json"

    @property
    def aborted(self) -> Path:
        return self.run_dir / "aborted.json"

    def earlier_abort(self, stamp: str) -> Path:
        return self.attempts_dir / f"aborted-{stamp}.json"

    @property
    def receipt(self) -> Path:
        return self.run_dir / "receipt.json"

    @property
    def receipt_signature(self) -> Path:
        return self.run_dir / "receipt.sig"

    @property
    def receipt_public_key(self) -> Path:
        return self.run_dir / "receipt-key.pub"

    @property
    def scan_canary(self) -> Path:
        return self.attempts_dir / "scan-canary.txt"

    @property
    def report_md(self) -> Path:
        return self.run_dir / "report.md"

    @property
    def report_png(self) -> Path:
        return self.run_dir / "report.png"

    @property
    def report_html(self) -> Path:
        return self.run_dir / "report.html"

    @property
    def report_files(self) -> Path:
        return self.run_dir / "report-files"

    @property
    def report_pass_rates_png(self) -> Path:
        return self.report_files / "pass-rates.png"

    @property
    def report_timeline_png(self) -> Path:
        return self.report_files / "timeline.png"

    def relative(self, path: Path) -> str:
        """``path`` as a link from a file at the top of the run directory (report.html)."""
        return path.relative_to(self.run_dir).as_posix()
