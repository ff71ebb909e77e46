"""The schedule: the ordered cell list of a lock, one batch per model.

Inside a batch the (task, repeat) blocks run one after another; the harness order inside each
block is a row of a cyclic Latin square, so across the blocks every harness takes every position
equally often (exactly, when the block count is a multiple of the harness count). The task order
inside each repeat is shuffled by the lock's published seed. The schedule SHA-256 is the
sha256 of the canonical JSON, which is also the exact content of ``schedule.json``.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Literal

from pydantic import Field

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.models import FrozenModel
from runner.spec.lock import Lock

SCHEMA_VERSION: Literal[1] = 1


class Cell(FrozenModel):
    id: str
    batch: str
    position: int = Field(ge=1)
    model: str
    task: str
    repeat: int = Field(ge=1)
    harness: str


class Batch(FrozenModel):
    id: str
    model: str
    lock_fingerprint: str
    cells: tuple[Cell, ...]


class Schedule(FrozenModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    lock_name: str
    lock_fingerprint: str
    schedule_seed: int
    design: Literal["cyclic-latin-square"] = "cyclic-latin-square"
    batches: tuple[Batch, ...]

    @property
    def sha256(self) -> str:
        return sha256_digest(canonical_json(self))

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(cell for batch in self.batches for cell in batch.cells)

    def batch(self, batch_id: str) -> Batch:
        return next(batch for batch in self.batches if batch.id == batch_id)


def cell_id(batch: str, position: int, task: str, repeat: int, harness: str) -> str:
    return f"{batch}-{position:03d}-{task}-r{repeat}-{harness}"


def _seeded_rng(seed: int, *labels: object) -> random.Random:
    # A stable integer seed from the published seed and the labels: the same on every
    # platform and Python version (str hashing is randomised, sha256 is not).
    material = ":".join(str(part) for part in (seed, *labels)).encode()
    return random.Random(int.from_bytes(hashlib.sha256(material).digest()[:8], "big"))


def build_schedule(lock: Lock) -> Schedule:
    harnesses = [harness.id for harness in lock.harnesses]
    batches = []
    for model in lock.models:
        blocks: list[tuple[str, int]] = []
        for repeat in range(1, lock.repeats + 1):
            tasks = list(lock.tasks.ids)
            _seeded_rng(lock.schedule_seed, model.id, repeat).shuffle(tasks)
            blocks.extend((task, repeat) for task in tasks)
        cells: list[Cell] = []
        for block_index, (task, repeat) in enumerate(blocks):
            for offset in range(len(harnesses)):
                harness = harnesses[(block_index + offset) % len(harnesses)]
                position = len(cells) + 1
                cells.append(
                    Cell(
                        id=cell_id(model.id, position, task, repeat, harness),
                        batch=model.id,
                        position=position,
                        model=model.id,
                        task=task,
                        repeat=repeat,
                        harness=harness,
                    )
                )
        batches.append(
            Batch(
                id=model.id,
                model=model.id,
                lock_fingerprint=lock.for_model(model.id).fingerprint,
                cells=tuple(cells),
            )
        )
    return Schedule(
        lock_name=lock.name,
        lock_fingerprint=lock.fingerprint,
        schedule_seed=lock.schedule_seed,
        batches=tuple(batches),
    )


def position_counts(batch: Batch, harness_count: int) -> dict[str, Counter[int]]:
    """For each harness, how often it ran at each position inside its block."""
    counts: dict[str, Counter[int]] = {}
    for cell in batch.cells:
        counts.setdefault(cell.harness, Counter())[(cell.position - 1) % harness_count] += 1
    return counts


def is_balanced(batch: Batch, harness_count: int) -> bool:
    counts = position_counts(batch, harness_count)
    values = {n for counter in counts.values() for n in counter.values()}
    return len(values) == 1 and all(len(c) == harness_count for c in counts.values())
