"""``runner report RUN_DIR``: derive receipt.json, report.md and report.png from a run directory."""

from __future__ import annotations

from pathlib import Path

from runner.core.errors import InputError
from runner.core.files import read_model, write_atomic, write_model
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.records.schedule import Schedule
from runner.run.receipt import (
    BatchReceipt,
    Comparison,
    EvidenceState,
    GroupSummary,
    Receipt,
    RunAbort,
    Totals,
    build_receipt,
)
from runner.spec.lock import load_lock
from runner.verify.report import VerifyReport

NOT_RETURNED = "not returned"
_METRIC_WORDS = {
    "provider_tokens": "tokens",
    "physical_posts": "physical POSTs",
    "wall_seconds": "wall time",
}


def scan_state(paths: RunPaths) -> EvidenceState:
    from runner.run.scan import ScanReport  # the scan room owns its file format

    if not paths.scan.exists():
        return "missing"
    scan = read_model(paths.scan, ScanReport)
    if scan.leaks:
        return "leaks"
    return "clean" if scan.clean else "failed"


def verify_state(paths: RunPaths) -> EvidenceState:
    if not paths.final_verify.exists():
        return "missing"
    return "passed" if read_model(paths.final_verify, VerifyReport).passed else "failed"


def load_run(paths: RunPaths) -> Receipt:
    if not paths.run_dir.is_dir():
        raise InputError(f"{paths.run_dir}: no such run directory")
    lock = load_lock(paths.lock)
    schedule = read_model(paths.schedule, Schedule)
    if schedule.lock_fingerprint != lock.fingerprint:
        raise InputError(f"{paths.schedule}: schedule was made from another lock")
    lines = Ledger(paths).lines()
    aborted = read_model(paths.aborted, RunAbort) if paths.aborted.exists() else None
    return build_receipt(lock, schedule, lines, scan_state(paths), verify_state(paths), aborted)


def write_report(run_dir: Path) -> Receipt:
    paths = RunPaths(run_dir)
    receipt = load_run(paths)
    write_model(paths.receipt, receipt)
    write_atomic(paths.report_md, (render_markdown(receipt) + prompt_overhead(paths)).encode())
    plot(receipt, paths.report_png)
    return receipt


def prompt_overhead(paths: RunPaths) -> str:
    """Per harness, what the proxy saw in each cell's first request: the tools offered (the
    evidence its extensions loaded) and its fixed prompt overhead in bytes (min-max over cells)."""
    labels = {harness.id: harness.label for harness in load_lock(paths.lock).harnesses}
    seen: dict[str, list[PromptFootprint]] = {}
    for line in Ledger(paths).lines():
        if line.first_request is not None:
            seen.setdefault(line.harness, []).append(line.first_request)
    if not seen:
        return ""

    def span(values: list[int]) -> str:
        low, high = min(values), max(values)
        return f"{low:,}" if low == high else f"{low:,}-{high:,}"

    rows = [
        "## Harness prompt overhead (first request of each cell)",
        "",
        "| harness | cells | tools | system prompt bytes | tool definitions bytes | tool names |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for harness, footprints in sorted(seen.items()):
        names = sorted({name for footprint in footprints for name in footprint.tool_names})
        rows.append(
            f"| {labels.get(harness, harness)} | {len(footprints)} "
            f"| {span([len(f.tool_names) for f in footprints])} "
            f"| {span([f.system_prompt_bytes for f in footprints])} "
            f"| {span([f.tool_definitions_bytes for f in footprints])} | {', '.join(names)} |"
        )
    return "\n".join([*rows, ""]) + "\n"


def fmt_tokens(totals: Totals) -> str:
    if totals.provider_tokens is None:
        return NOT_RETURNED
    if totals.token_cells_returned < totals.cells:
        return f"{totals.provider_tokens:,} ({totals.token_cells_returned}/{totals.cells} cells)"
    return f"{totals.provider_tokens:,}"


def _table(title: str, groups: tuple[GroupSummary, ...]) -> list[str]:
    rows = [
        f"| {title} | pass | fail | indeterminate | wall s | provider tokens "
        "| physical POST | logical attempts | extra POST |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group in groups:
        t = group.totals
        rows.append(
            f"| {group.label} | {t.passed} | {t.failed} | {t.indeterminate} "
            f"| {t.wall_seconds:,.3f} | {fmt_tokens(t)} | {t.physical_posts} "
            f"| {t.logical_attempts} | {t.unattributed_provider_post_requests} |"
        )
    return rows


def describe(comparison: Comparison, labels: dict[str, str]) -> str:
    """E.g. 'Pi + OpenPI vs OMP, tokens: -84.7 % (0.15x; OMP = 6.56x Pi + OpenPI)'."""
    subject, baseline = labels[comparison.subject], labels[comparison.baseline]
    inverse = 1 / comparison.ratio if comparison.ratio else float("inf")
    return (
        f"{subject} vs {baseline}, {_METRIC_WORDS[comparison.metric]}: "
        f"{comparison.percent_difference:+.1f} % ({comparison.ratio:.2f}x; "
        f"{baseline} = {inverse:.2f}x {subject})"
    )


def _batch_section(batch: BatchReceipt) -> list[str]:
    labels = {group.key: group.label for group in batch.harnesses}
    lines = [
        f"## Batch `{batch.batch}`: {batch.model}",
        "",
        f"Status: **{batch.status}** · lock fingerprint `{batch.lock_fingerprint}` · "
        f"{batch.cells_recorded}/{batch.cells_scheduled} cells recorded",
        "",
        *(f"- failed closed: {reason}" for reason in batch.reasons),
        "",
        *_table("harness", batch.harnesses),
        "",
        *_table("task", batch.tasks),
        "",
        "Comparisons (subject vs baseline; percent difference and ratio):",
        "",
        *(f"- {describe(comparison, labels)}" for comparison in batch.comparisons),
    ]
    missing_tokens = [g.label for g in batch.harnesses if g.totals.provider_tokens is None]
    if missing_tokens:
        lines += ["", f"Provider tokens {NOT_RETURNED} for: {', '.join(missing_tokens)}."]
    return [*lines, ""]


def render_markdown(receipt: Receipt) -> str:
    ids = receipt.identities
    lines = [
        f"# Benchmark report: {ids.lock_name}",
        "",
        f"**Status: {receipt.status}**",
        "",
    ]
    if ids.provider_note:
        lines += [f"> {ids.provider_note}", ""]
    lines += [
        "| frozen identity | value |",
        "|---|---|",
        f"| lock fingerprint | `{ids.lock_fingerprint}` |",
        f"| schedule sha256 | `{ids.schedule_sha256}` |",
        f"| guest | {ids.guest} |",
        *(f"| {tool} | {version} |" for tool, version in ids.tools.items()),
        *(f"| harness {key} | `{source}` |" for key, source in ids.harnesses.items()),
        f"| task source | {ids.task_source} |",
        f"| task revision | {ids.task_revision or 'local directory'} |",
        f"| credential scan | {receipt.credential_scan} |",
        f"| final verify | {receipt.final_verify} |",
        "",
        *(f"- failed closed: {reason}" for reason in receipt.reasons),
        "",
    ]
    for batch in receipt.batches:
        lines += _batch_section(batch)
    return "\n".join(lines) + "\n"


def plot(receipt: Receipt, path: Path) -> None:
    """Wall time and provider tokens per harness, one row per batch."""
    # Imported here: matplotlib costs seconds of start-up that every other verb would pay.
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark host
    import matplotlib.pyplot as plt

    batches = receipt.batches
    figure, axes = plt.subplots(len(batches), 2, figsize=(11, 3.6 * len(batches)), squeeze=False)
    for row, batch in enumerate(batches):
        labels = [group.label for group in batch.harnesses]
        positions = list(range(len(labels)))
        wall_axis, token_axis = axes[row]
        wall_axis.bar(positions, [g.totals.wall_seconds for g in batch.harnesses])
        wall_axis.set_title(f"{batch.model}: wall seconds")
        tokens = [group.totals.provider_tokens for group in batch.harnesses]
        # A missing value gets no bar and a label, never a bar of height 0.
        token_axis.bar(
            [p for p, value in zip(positions, tokens, strict=True) if value is not None],
            [value for value in tokens if value is not None],
            color="tab:orange",
        )
        for position, value in zip(positions, tokens, strict=True):
            if value is None:
                token_axis.text(
                    position,
                    0.5,
                    NOT_RETURNED,
                    ha="center",
                    va="center",
                    transform=token_axis.get_xaxis_transform(),
                )
        token_axis.set_title(f"{batch.model}: provider tokens")
        if all(value is None for value in tokens):
            token_axis.set_yticks([])
        for axis in (wall_axis, token_axis):
            axis.set_xticks(positions, labels)
            axis.set_xlim(-0.6, len(labels) - 0.4)
            axis.set_ylim(bottom=0)
    figure.suptitle(f"{receipt.identities.lock_name}: {receipt.status}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
