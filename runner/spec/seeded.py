"""The seeded stand-in model: the offline scripted provider answering as a model varies.

A lock's scripted model with ``model = "seeded"`` carries a ``seeded`` table (``SeededModel``):
a seed, a range of exploratory turns and the probability of a wrong answer. Per cell, from the
seed and the cell's id, it draws how many exploratory turns (harmless bash calls: listing,
reading files, running the tests) are played before the task's reference solution, and whether
the wrong answer is played instead. It is a STAND-IN for a model, never a model.

The draws are sha256 of ``"<seed>:<cell id>:<what>"``, read as an integer (its first 8 bytes,
big-endian), not Python's ``hash()`` nor ``random``: a reviewer recomputes them from the lock
and the ledger line with any sha256:

- ``turns``     = min_turns + (u_turns mod (max_turns - min_turns + 1))
- ``wrong``     = u_wrong / 2**64 < wrong_probability

A cell run again (a retried or resumed attempt) draws the same: the draws are the cell's.
"""

from __future__ import annotations

import hashlib

from pydantic import Field, model_validator

from runner.core.models import FrozenModel

# The lock's model name (``models.model``) of the seeded stand-in.
SEEDED_MODEL = "seeded"
_UNIT = 2**64


class SeededModel(FrozenModel):
    """``[[models]].seeded``: the seeded stand-in's parameters (a frozen condition of the run)."""

    seed: int = Field(ge=0)
    min_turns: int = Field(default=0, ge=0, le=50)
    max_turns: int = Field(ge=0, le=50)
    wrong_probability: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _range(self) -> SeededModel:
        if self.max_turns < self.min_turns:
            raise ValueError(f"max_turns {self.max_turns} is below min_turns {self.min_turns}")
        return self


class SeededDraws(FrozenModel):
    """What the seeded stand-in drew for one cell: the ledger line keeps it."""

    seed: int = Field(ge=0)
    exploratory_turns: int = Field(ge=0)
    wrong_answer: bool
    # The uniform draw the wrong answer was decided by (u_wrong / 2**64), for the reviewer.
    wrong_draw: float = Field(ge=0, lt=1)


def _uniform(seed: int, cell_id: str, what: str) -> int:
    digest = hashlib.sha256(f"{seed}:{cell_id}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def seeded_draws(model: SeededModel, cell_id: str) -> SeededDraws:
    """The cell's draws: the same seed and cell id give the same draws on every machine."""
    span = model.max_turns - model.min_turns + 1
    wrong_draw = _uniform(model.seed, cell_id, "wrong") / _UNIT
    return SeededDraws(
        seed=model.seed,
        exploratory_turns=model.min_turns + _uniform(model.seed, cell_id, "turns") % span,
        wrong_answer=wrong_draw < model.wrong_probability,
        wrong_draw=wrong_draw,
    )
