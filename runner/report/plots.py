"""The report's PNG plots (matplotlib, Agg, fixed size, DPI and metadata: the same run gives
the same bytes with the same matplotlib). They draw numbers of the receipt and the cells of the
run; they compute none."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from runner.report.document import NOT_RETURNED
from runner.report.receipt import BatchReceipt, Receipt
from runner.report.run_cells import CELL_STATES, CellState, RunCell
from runner.report.stats import Proportion

if TYPE_CHECKING:  # matplotlib is imported where it draws: it costs seconds of start-up
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
# No "Software" key (it names matplotlib's version): the bytes depend on the run alone.
PNG_METADATA: dict[str, str | None] = {"Software": None}
STATE_COLOURS: dict[CellState, str] = {
    "pass": "#2e7d32",
    "fail": "#c62828",
    "indeterminate": "#f9a825",
    "not run": "#eeeeee",
}


def figure(rows: int, height: float) -> tuple[Figure, list[Axes]]:
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark host
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 1, figsize=(11, height * rows), squeeze=False)
    return fig, [row[0] for row in axes]


def save(fig: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata=PNG_METADATA)
    plt.close(fig)


def _error_bar(passes: Proportion) -> tuple[float, float]:
    """Distances from the rate down and up to its interval's bounds (matplotlib's yerr)."""
    rate = passes.rate or 0.0
    if passes.interval is None:
        return 0.0, 0.0
    return rate - passes.interval.low, passes.interval.high - rate


def _pass_rate_axis(axis: Axes, batch: BatchReceipt) -> None:
    groups = batch.stats.harnesses if batch.stats is not None else ()
    positions = list(range(len(groups)))
    shown = [(p, g.passes) for p, g in zip(positions, groups, strict=True) if g.passes.n]
    errors = [_error_bar(passes) for _, passes in shown]
    axis.bar(
        [position for position, _ in shown],
        [passes.rate or 0.0 for _, passes in shown],
        yerr=[[low for low, _ in errors], [high for _, high in errors]],
        capsize=6,
        color="tab:green",
    )
    for position, group in zip(positions, groups, strict=True):
        if not group.passes.n:  # no bar of height 0 for a harness without cells
            axis.text(position, 0.5, "no cells", ha="center", va="center")
    axis.set_xticks(positions, [group.label for group in groups])
    axis.set_xlim(-0.6, max(len(groups), 1) - 0.4)
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("pass rate")
    confidence = batch.stats.methods.confidence if batch.stats is not None else 0.95
    axis.set_title(f"{batch.model}: pass rate per harness, Wilson {confidence:.0%} interval")


def pass_rates(receipt: Receipt, path: Path) -> None:
    """Pass rate per harness with its Wilson interval as error bars, one row per batch."""
    fig, axes = figure(len(receipt.batches), 3.4)
    for axis, batch in zip(axes, receipt.batches, strict=True):
        _pass_rate_axis(axis, batch)
    save(fig, path)


def _timeline_axis(axis: Axes, batch: BatchReceipt, cells: tuple[RunCell, ...]) -> None:
    from matplotlib.patches import Patch

    rows = [group.key for group in batch.harnesses]
    for run_cell in cells:
        state = run_cell.state
        axis.barh(
            rows.index(run_cell.cell.harness),
            0.9,
            left=run_cell.cell.position - 0.45,
            color=STATE_COLOURS[state],
            edgecolor="#9e9e9e" if state == "not run" else STATE_COLOURS[state],
            hatch="//" if state == "not run" else None,
        )
    block = len(rows)
    for boundary in range(block, len(cells), block):
        axis.axvline(boundary + 0.5, color="#bdbdbd", linewidth=0.6)
    axis.set_yticks(range(len(rows)), [group.label for group in batch.harnesses])
    axis.invert_yaxis()
    axis.set_xlim(0.4, len(cells) + 0.6)
    axis.set_xlabel("position in the schedule")
    axis.set_title(f"{batch.model}: cells in schedule order")
    axis.legend(
        handles=[Patch(color=STATE_COLOURS[state], label=state) for state in CELL_STATES],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )


def timeline(receipt: Receipt, cells: dict[str, tuple[RunCell, ...]], path: Path) -> None:
    """Every scheduled cell of each batch, in schedule order, coloured by its outcome."""
    fig, axes = figure(len(receipt.batches), 2.4)
    for axis, batch in zip(axes, receipt.batches, strict=True):
        _timeline_axis(axis, batch, cells.get(batch.batch, ()))
    save(fig, path)


def wall_and_tokens(receipt: Receipt, path: Path) -> None:
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
    save(figure, path)
