"""The report's sections of the whole run: the title, the status and the frozen identities (with
the judge, the evidence and the signer), the unjudged tasks' rule, the failure classes, the
harnesses' prompt overhead and the tasks as the lab ran them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runner.records.prompt import PromptFootprint
from runner.records.run_tasks import TaskMirrorFiles
from runner.report.document import (
    Align,
    Block,
    Code,
    Heading,
    L,
    Note,
    Paragraph,
    R,
    Strong,
    Table,
    bullets,
    table,
)
from runner.report.failure_summary import render_failure_classes
from runner.report.judge import Judge
from runner.report.receipt import Receipt
from runner.report.signing import fingerprint_of
from runner.spec.task_derivation import TaskDerivation


def run_section(receipt: Receipt) -> list[Block]:
    """The title, the status, the provider note of a receipt written before each batch carried
    its own, and the frozen identities of the run."""
    ids = receipt.identities
    return [
        Heading(1, (f"Benchmark report: {ids.lock_name}",)),
        Paragraph((Strong(f"Status: {receipt.status}"),)),
        *([Note((ids.provider_note,))] if ids.provider_note else []),
        *_unjudged_rule(receipt),
        _identity_table(receipt),
        *bullets(f"failed closed: {reason}" for reason in receipt.reasons),
    ]


def _identity_table(receipt: Receipt) -> Table:
    ids = receipt.identities
    rows: list[tuple[str, str]] = [
        ("lock fingerprint", Code(ids.lock_fingerprint)),
        ("schedule sha256", Code(ids.schedule_sha256)),
        ("guest", ids.guest),
        *ids.tools.items(),
        *((f"harness {key}", Code(source)) for key, source in ids.harnesses.items()),
        ("task source", ids.task_source),
        ("task revision", ids.task_revision or "local directory"),
        ("credential scan", receipt.credential_scan),
        ("final verify", receipt.final_verify),
        ("placement", receipt.placement.line if receipt.placement else "not recorded"),
        *(
            (f"harness {cache.harness} compiled cache", cache.line)
            for cache in receipt.compiled_caches or ()
        ),
        *_judge_rows(receipt.identities.judge),
        *_evidence_rows(receipt),
    ]
    return table([("frozen identity", L), ("value", L)], rows)


def _judge_rows(judge: Judge | None) -> list[tuple[str, str]]:
    """The runner and host venv that wrote the receipt; none in receipts written before it."""
    if judge is None:
        return []
    rows: list[tuple[str, str]] = [
        ("runner", Code(judge.runner)),
        ("host lock sha256", Code(judge.host_lock_sha256 or "no host lock")),
        *judge.computing_versions().items(),
    ]
    if judge.unlocked_host:
        rows.append(("host venv UNLOCKED", judge.unlocked_host))
    return rows


def _evidence_rows(receipt: Receipt) -> list[tuple[str, str]]:
    """The chain's head, the frozen digests and the signer; "not recorded" in older receipts."""
    chain, frozen = receipt.ledger_chain, receipt.frozen
    rows: list[tuple[str, str]] = [
        ("ledger chain", f"{chain.state} ({chain.lines} lines)" if chain else "not recorded"),
        ("ledger chain head", Code(chain.head) if chain else "not recorded"),
    ]
    if frozen is not None:
        found = frozen.model_dump(exclude={"derived_task_trees"})
        rows += [(name.replace("_", " "), Code(value or "none")) for name, value in found.items()]
        rows += [(f"task {t} derived tree", Code(d)) for t, d in frozen.derived_task_trees.items()]
    rows.append(("receipt signed by", Code(receipt.signed_by or "not signed")))
    if receipt.signed_by:
        rows.append(("signer fingerprint", Code(fingerprint_of(receipt.signed_by))))
    return rows


def _unjudged_rule(receipt: Receipt) -> list[Block]:
    """Which tasks every pass rate leaves out, and by which rule (none in older receipts)."""
    unjudged = receipt.unjudged
    if unjudged is None:
        return []
    names = ", ".join(unjudged.tasks) or "none"
    if unjudged.rule == "freeze":
        audited = receipt.frozen.freeze_manifest_sha256 if receipt.frozen else None
        which = (
            "the freeze the final verify audited"
            if audited == unjudged.freeze_manifest_sha256
            else "no final verify audited it"
        )
        return [
            Paragraph(
                (
                    f"Unjudged tasks, from freeze.json ({which}): {names}; every cell of them is "
                    "left out of every pass rate.",
                )
            )
        ]
    kept = (
        "its freeze.json records no oracle scores"
        if unjudged.freeze_manifest_sha256
        else "the run dir keeps no freeze.json"
    )
    return [
        Paragraph(
            (
                f"Unjudged tasks, by the ledger ({kept}): a task any of whose cells the cell "
                f"runner overruled as unjudged: {names}.",
            )
        )
    ]


def failure_class_section(receipt: Receipt) -> list[Block]:
    summary = receipt.failure_classes
    return render_failure_classes(summary) if summary is not None else []


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def prompt_overhead(footprints: Mapping[str, Sequence[PromptFootprint]]) -> list[Block]:
    """Per harness, what the proxy saw in each cell's first request: the tools offered (the
    evidence its extensions loaded) and its fixed prompt overhead in bytes (min-max over cells).
    No section when no cell has a first request recorded."""
    if not footprints:
        return []
    columns: list[tuple[str, Align]] = [("harness", L), ("cells", R), ("tools", R)]
    columns += [("system prompt bytes", R), ("tool definitions bytes", R), ("tool names", L)]
    return [
        Heading(2, ("Harness prompt overhead (first request of each cell)",)),
        table(
            columns,
            (
                (
                    label,
                    str(len(found)),
                    _span([len(f.tool_names) for f in found]),
                    _span([f.system_prompt_bytes for f in found]),
                    _span([f.tool_definitions_bytes for f in found]),
                    ", ".join(sorted({name for f in found for name in f.tool_names})),
                )
                for label, found in footprints.items()
            ),
        ),
    ]


def task_section(tasks: Sequence[TaskDerivation]) -> list[Block]:
    """Per task: its upstream tree, the tree the lab ran, and every change the lock's rules made
    (runner.spec.task_derivation). No section for a run that recorded none."""
    if not tasks:
        return []
    blocks: list[Block] = [
        Heading(2, ("Tasks as the lab ran them",)),
        table(
            [("task", L), ("", L), ("upstream tree", L), ("derived tree", L)],
            (
                (
                    task.id,
                    "derived" if task.derived else "as upstream",
                    Code(task.upstream_tree),
                    Code(task.derived_tree),
                )
                for task in tasks
            ),
        ),
        Paragraph(
            (
                "Each task's own task.toml; the network a task asks for is recorded, not granted: "
                "every task runs offline, reaching only the lab's mirror and provider proxy.",
            )
        ),
        table(
            [("task", L), ("task.toml schema", L), ("build timeout", R), ("network asked", L)],
            (
                (
                    task.id,
                    task.settings.schema_version,
                    f"{task.settings.build_timeout_sec:g} s",
                    f"{task.settings.network} ({task.settings.network_from})",
                )
                for task in tasks
            ),
        ),
    ]
    if uses := [(task.id, use) for task in tasks for use in task.base_images]:
        blocks += [
            Paragraph(
                ("Each FROM name, the image the lab built the task on, and how they differ:",)
            ),
            table(
                [("task", L), ("FROM", L), ("named", L), ("used", L), ("differs", L)],
                (
                    (task, Code(use.from_name), use.named, use.used, "; ".join(use.differs) or "-")
                    for task, use in uses
                ),
            ),
        ]
    for task in tasks:
        if task.changes:
            blocks += [Paragraph((Strong(f"{task.id}: derived"),))]
            blocks += bullets(task.changes)
    return blocks


def mirror_files_section(files: Sequence[TaskMirrorFiles]) -> list[Block]:
    """Per task, what the lab's mirror serves it beyond the guest's frozen set: what its image
    build and its trial (its oracle) took when recorded. None: the section is left out."""
    if not files:
        return []
    return [
        Paragraph(
            (
                "What the lab's mirror serves each task beyond the guest's own frozen set, as "
                "recorded from the task's image build and from its trial (its reference solution "
                "and verifier); a request for anything else is a miss:",
            )
        ),
        table(
            [("task", L), ("recorded from", L), ("files", R), ("MB", R)],
            (
                (
                    entry.task,
                    entry.kind,
                    str(entry.files),
                    f"{entry.size / 1e6:.1f}",
                )
                for entry in files
            ),
        ),
    ]
