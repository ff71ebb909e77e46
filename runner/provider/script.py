"""What the offline scripted provider answers: a script per task, given inline or built from a task.

A script is a list of assistant turns played in order, then a final text turn that stops the
agent. A fault plan names POSTs (counted from the moment the script is loaded) that the provider
answers badly on purpose, so that client retries happen and show up in the accounting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from runner.core.errors import InputError
from runner.core.models import FrozenModel, updated
from runner.spec.seeded import SEEDED_MODEL, SeededDraws

PROVIDER_MARKER = "offline-scripted"


class ToolCall(FrozenModel):
    tool: str = Field(default="bash", min_length=1)
    arguments: dict[str, Any]


class Turn(FrozenModel):
    """One assistant message: optional text, then tool calls (none means the agent stops)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class Fault(FrozenModel):
    """How to answer the ``post``-th POST (1-based) since the script was loaded.

    ``http_error`` answers ``status`` with an error body; ``stall`` waits ``seconds`` before
    answering normally; ``disconnect`` starts a streamed answer and drops the connection.
    """

    post: int = Field(ge=1)
    kind: Literal["http_error", "stall", "disconnect"]
    status: int = Field(default=500, ge=400, le=599)
    seconds: float = Field(default=0.0, ge=0, le=3600)


class ProviderScript(FrozenModel):
    name: str = Field(min_length=1)
    turns: tuple[Turn, ...]
    final_text: str = "Done."
    faults: tuple[Fault, ...] = ()
    usage_details: bool = Field(
        default=True,
        description="answers carry their shape's cache and reasoning usage fields; False: "
        "input and output tokens only, as a provider without a cache reports",
    )

    def turn(self, index: int) -> Turn:
        """The turn for the ``index``-th assistant message; past the end, the final stop."""
        if index < len(self.turns):
            return self.turns[index]
        return Turn(text=self.final_text)

    def fault_for(self, post: int) -> Fault | None:
        return next((fault for fault in self.faults if fault.post == post), None)


def reference_solution(task_dir: Path) -> ProviderScript:
    """The task's reference solution (Harbor's ``solution/solve.sh``) run as one bash call."""
    solve = task_dir / "solution" / "solve.sh"
    try:
        command = solve.read_text()
    except FileNotFoundError:
        raise InputError(f"{solve}: no reference solution for the scripted provider") from None
    return ProviderScript(
        name=f"reference-solution:{task_dir.name}",
        turns=(Turn(text="Running the reference solution.", tool_calls=(_bash(command),)),),
        final_text="The reference solution has run.",
    )


def wrong_answer(task_dir: Path) -> ProviderScript:
    """A scripted failure: look around once, then stop without solving anything."""
    return ProviderScript(
        name=f"wrong-answer:{task_dir.name}",
        turns=(Turn(text="Looking around.", tool_calls=(_bash("pwd; ls -la"),)),),
        final_text="I give up on this task.",
    )


def stalled(task_dir: Path) -> ProviderScript:
    """A provider that never answers the first request: the cell can only end at its deadline."""
    return ProviderScript(
        name=f"stalled:{task_dir.name}",
        turns=(Turn(text="Never sent.", tool_calls=(_bash("true"),)),),
        final_text="Never sent.",
        faults=(Fault(post=1, kind="stall", seconds=3600),),
    )


OUTAGE_POSTS = 64  # more than any harness retries one request


def provider_outage(task_dir: Path) -> ProviderScript:
    """A provider down for the whole cell: every POST is answered 503, none with a turn."""
    return ProviderScript(
        name=f"provider-outage:{task_dir.name}",
        turns=(),
        final_text="Never sent.",
        faults=tuple(
            Fault(post=post, kind="http_error", status=503) for post in range(1, OUTAGE_POSTS + 1)
        ),
    )


def _bash(command: str) -> ToolCall:
    return ToolCall(tool="bash", arguments={"command": command})


# The seeded stand-in's exploratory turns, played in this order (the n-th turn the n-th,
# cycling): each a harmless look at the task's working directory, as a model's first turns are.
# Nothing is written there (pytest without its cache), so the verifier judges the same tree.
EXPLORATION: tuple[tuple[str, str], ...] = (
    ("Listing the working directory.", "pwd; ls -la"),
    ("Looking for the files that matter.", "find . -maxdepth 2 -not -path '*/.git/*' | head -n 60"),
    (
        "Reading the first files.",
        "for f in $(find . -maxdepth 2 -type f -not -path '*/.git/*' | sort | head -n 3); do "
        'echo "== $f"; head -n 20 "$f"; done',
    ),
    (
        "Running the tests there are.",
        "(python3 -m pytest -q -x -p no:cacheprovider 2>&1 || true) | tail -n 15",
    ),
    ("Checking the tools at hand.", "command -v python3 git sqlite3 curl || true; uname -m"),
)


def exploratory_turns(count: int) -> tuple[Turn, ...]:
    """``count`` exploratory turns, one harmless bash call each."""
    return tuple(
        Turn(text=text, tool_calls=(_bash(command),))
        for text, command in (EXPLORATION[n % len(EXPLORATION)] for n in range(count))
    )


def seeded(task_dir: Path, draws: SeededDraws) -> ProviderScript:
    """The seeded STAND-IN for a model (runner.spec.seeded): the cell's drawn exploratory turns,
    then the task's reference solution, or the wrong answer when that was drawn."""
    played = wrong_answer(task_dir) if draws.wrong_answer else reference_solution(task_dir)
    answer = "wrong-answer" if draws.wrong_answer else "reference-solution"
    return updated(
        played,
        name=f"seeded-stand-in:{answer}:{draws.exploratory_turns}-turns:{task_dir.name}",
        turns=exploratory_turns(draws.exploratory_turns) + played.turns,
    )


# The lock's model name (models.model) picks the script of every cell of a scripted batch.
SCRIPTS_BY_MODEL = {
    "reference-solution": reference_solution,
    "wrong-answer": wrong_answer,
    "stalled": stalled,
    "provider-outage": provider_outage,
}


def script_for(model_name: str, task_dir: Path, draws: SeededDraws | None = None) -> ProviderScript:
    """The script of a cell of the scripted model ``model_name``; the seeded stand-in's needs
    the cell's ``draws`` (``runner.spec.seeded.seeded_draws``)."""
    if model_name == SEEDED_MODEL:
        if draws is None:
            raise InputError(f"scripted model '{SEEDED_MODEL}' needs the cell's draws")
        return seeded(task_dir, draws)
    try:
        build = SCRIPTS_BY_MODEL[model_name]
    except KeyError:
        known = ", ".join(sorted([*SCRIPTS_BY_MODEL, SEEDED_MODEL]))
        raise InputError(f"scripted model '{model_name}' is unknown (known: {known})") from None
    return build(task_dir)
