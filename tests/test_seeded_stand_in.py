"""locks/seed-arm64.toml (the reference run's shape on arm64) and its seeded stand-in model:
the schedule, the draws (the same seed the same draws, another seed others, recomputable from
a ledger line with any sha256), the script the provider plays, and a cell through the real
proxy and scripted provider whose ledger line says what the provider did."""

from __future__ import annotations

import hashlib
import json
import tomllib
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from runner.core.errors import InputError
from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.lab.transport import ExecResult
from runner.provider.script import EXPLORATION, script_for
from runner.proxy import CredentialProxy
from runner.proxy.bearer import BEARER_SHAPE
from runner.records.ledger import Ledger, LedgerLine
from runner.records.paths import RunPaths
from runner.records.schedule import build_schedule, is_balanced, position_counts
from runner.spec.lock import Lock, Model, load_lock
from runner.spec.resolution import Resolution, resolution_path
from runner.spec.seeded import SeededDraws, SeededModel, seeded_draws
from tests.support.cell_fixtures import runner_for
from tests.support.fake_transport import FakeTransport, answer

SEED_ARM64 = REPO_ROOT / "locks" / "seed-arm64.toml"
TB21 = REPO_ROOT / "locks" / "tb21.toml"
# The schedule SHA-256 of locks/seed-arm64.toml: a change to the lock's schedule (its seed,
# models, harnesses, tasks, repeats) or to the schedule's design changes it.
SEED_ARM64_SCHEDULE = "sha256:3f3cf67f37bdacb68f86f502ae06b8621c7a63720b157d5fe2b9011933df15b3"


@pytest.fixture(scope="module")
def lock() -> Lock:
    return load_lock(SEED_ARM64)


def seeded_of(lock: Lock, model_id: str) -> SeededModel:
    seeded = next(model for model in lock.models if model.id == model_id).seeded
    assert seeded is not None
    return seeded


def test_seed_arm64_is_the_reference_shape_with_what_runs_here(lock: Lock) -> None:
    tb21 = load_lock(TB21)
    schedule = build_schedule(lock)
    assert len(schedule.cells) == 36
    assert lock.tasks == tb21.tasks and lock.guest == tb21.guest and lock.tools == tb21.tools
    assert [h.label for h in lock.harnesses] == ["Bare Pi", "Pi + OpenPI"]
    assert [e.tag for e in lock.harnesses[1].extensions] == ["v0.3.0"]
    assert (lock.repeats, lock.concurrency, lock.cell_deadline_seconds) == (3, 1, 1800)
    assert schedule.sha256 == SEED_ARM64_SCHEDULE
    for batch in schedule.batches:
        # 9 blocks of 2 harnesses: the cyclic square is exact only on a multiple of 2 blocks, so
        # each harness is first in 5 or 4 of them (the lock says so).
        assert len(batch.cells) == 18 and not is_balanced(batch, 2)
        assert position_counts(batch, 2) == {"bare-pi": {0: 5, 1: 4}, "pi-openpi": {0: 4, 1: 5}}
        # Each (task, repeat) block holds both harnesses, their order alternating block by block.
        blocks = [batch.cells[i : i + 2] for i in range(0, 18, 2)]
        assert all(len({(c.task, c.repeat) for c in block}) == 1 for block in blocks)
        firsts = [block[0].harness for block in blocks]
        assert firsts == ["bare-pi", "pi-openpi"] * 4 + ["bare-pi"]
        assert {c.task for c in batch.cells} == set(tb21.tasks.ids)


def test_seed_arm64_says_why_omp_is_not_here_and_where_it_runs(lock: Lock) -> None:
    text = SEED_ARM64.read_text()
    assert "omp" not in {h.agent for h in lock.harnesses}
    assert "NOT RUNNABLE" in text and "@oh-my-pi/pi-natives-linux-x64 only" in text
    assert "locks/omp-x86_64.toml" in text
    assert load_lock(REPO_ROOT / "locks" / "omp-x86_64.toml").guest.arch == "x86_64"


def test_seed_arm64_states_the_compiled_cache_default(lock: Lock) -> None:
    raw = tomllib.loads(SEED_ARM64.read_text())
    assert [h["compiled_cache"] for h in raw["harnesses"]] == ["cold", "warm"]
    assert all("compiled_cache" in h.model_fields_set for h in lock.harnesses)


def test_seed_arm64_resolution_covers_the_lock(lock: Lock) -> None:
    resolution = read_model(resolution_path(SEED_ARM64, lock), Resolution)
    assert resolution.lock_environment == lock.environment_inputs
    assert {tree.harness for tree in resolution.harness_trees} == {"bare-pi", "pi-openpi"}


def test_the_two_models_differ_in_their_parameters(lock: Lock) -> None:
    steady, wander = seeded_of(lock, "steady"), seeded_of(lock, "wander")
    assert steady != wander
    assert steady.seed != wander.seed
    assert (steady.max_turns, steady.wrong_probability) != (
        wander.max_turns,
        wander.wrong_probability,
    )


def sha256_draw(seed: int, cell_id: str, what: str) -> int:
    """The draw as the module's docstring states it, written again from it."""
    return int(hashlib.sha256(f"{seed}:{cell_id}:{what}".encode()).hexdigest()[:16], 16)


def test_the_same_seed_gives_the_same_draws_and_another_seed_others(lock: Lock) -> None:
    steady = seeded_of(lock, "steady")
    cells = build_schedule(lock).cells
    first = [seeded_draws(steady, cell.id) for cell in cells]
    again = [seeded_draws(SeededModel(**steady.model_dump()), cell.id) for cell in cells]
    other = [seeded_draws(steady.model_copy(update={"seed": 7}), cell.id) for cell in cells]
    assert first == again
    assert [d.seed for d in other] == [7] * len(cells)
    assert [(d.exploratory_turns, d.wrong_draw) for d in first] != [
        (d.exploratory_turns, d.wrong_draw) for d in other
    ]


def test_the_draws_follow_the_stated_formula_and_parameters() -> None:
    model = SeededModel(seed=11, min_turns=1, max_turns=6, wrong_probability=0.3)
    ids = [f"cell-{n}" for n in range(2000)]
    draws = [seeded_draws(model, cell_id) for cell_id in ids]
    for cell_id, draw in zip(ids, draws, strict=True):
        assert draw.exploratory_turns == 1 + sha256_draw(11, cell_id, "turns") % 6
        assert draw.wrong_draw == sha256_draw(11, cell_id, "wrong") / 2**64
        assert draw.wrong_answer == (draw.wrong_draw < 0.3)
    assert {d.exploratory_turns for d in draws} == set(range(1, 7))
    assert 0.26 < sum(d.wrong_answer for d in draws) / len(draws) < 0.34
    never = SeededModel(seed=11, max_turns=0, wrong_probability=0)
    assert all(not seeded_draws(never, i).wrong_answer for i in ids[:50])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seeded": None}, "needs its 'seeded' table"),
        ({"model": "reference-solution"}, "only for the scripted model 'seeded'"),
        ({"seeded": {"seed": 1, "max_turns": 2, "wrong_probability": 0.1, "temp": 1}}, "extra"),
        ({"seeded": {"seed": 1, "min_turns": 3, "max_turns": 2, "wrong_probability": 0}}, "below"),
        ({"seeded": {"seed": 1, "max_turns": 2, "wrong_probability": 1.5}}, "less than or equal"),
    ],
)
def test_a_seeded_model_is_validated(lock: Lock, change: dict[str, Any], message: str) -> None:
    model = lock.models[0].model_dump() | change
    with pytest.raises(ValidationError, match=message):
        Model.model_validate(model)


def test_a_real_model_cannot_carry_a_seeded_table(lock: Lock) -> None:
    real = lock.models[0].model_dump() | {"base_url": "https://api.example.com/v1"}
    with pytest.raises(ValidationError, match="only for the scripted model"):
        Model.model_validate(real)


@pytest.mark.parametrize("wrong", [False, True])
def test_the_seeded_script_explores_then_plays_what_was_drawn(wrong: bool) -> None:
    task = REPO_ROOT / "tasks" / "sqlite-db-truncate"
    draws = SeededDraws(seed=1, exploratory_turns=7, wrong_answer=wrong, wrong_draw=0.5)
    script = script_for("seeded", task, draws)
    assert len(script.turns) == 8
    commands = [turn.tool_calls[0].arguments["command"] for turn in script.turns]
    assert commands[:7] == [command for _, command in (EXPLORATION * 2)[:7]]
    assert all(call.tool == "bash" for turn in script.turns for call in turn.tool_calls)
    solve = (task / "solution" / "solve.sh").read_text()
    assert (commands[-1] == solve) is not wrong
    assert script.name.startswith("seeded-stand-in:")
    with pytest.raises(InputError, match="needs the cell's draws"):
        script_for("seeded", task)


def conversing_harbor(proxy: CredentialProxy, commands: list[str], trials: Path) -> Any:
    """Harbor whose harness talks to the proxy until the provider stops calling tools, keeping
    each bash command it was asked to run; its result.json's agent phase spans the talk."""

    def respond(command: str) -> ExecResult:
        if "trial start" not in command:
            return answer(command)
        found = BEARER_SHAPE.search(command.encode())
        assert found is not None
        started = datetime.now(UTC)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        while True:
            body = {"model": "seeded", "messages": messages}
            request = urllib.request.Request(
                proxy.base_url + "/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {found[0].decode()}"},
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                message = json.load(response)["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            if not calls:
                break
            messages.append(message)
            for call in calls:
                commands.append(json.loads(call["function"]["arguments"])["command"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
        trial = trials / "trial-1"
        (trial / "agent").mkdir(parents=True, exist_ok=True)
        timing = {"started_at": started.isoformat(), "finished_at": datetime.now(UTC).isoformat()}
        result = {"verifier_result": {"rewards": {"reward": 1.0}}, "agent_execution": timing}
        (trial / "result.json").write_text(json.dumps(result))
        return answer(command)

    return respond


def test_a_seeded_cell_s_line_holds_the_draws_the_provider_played(
    lock: Lock, paths: RunPaths, proxy: CredentialProxy, tmp_path: Path
) -> None:
    trials = tmp_path / "trials"
    cells = build_schedule(lock).cells
    cell = next(c for c in cells if c.model == "wander")
    commands: list[str] = []
    guest = FakeTransport(conversing_harbor(proxy, commands, trials), trials)
    line = runner_for(lock, paths, proxy, guest).run(cell, Ledger(paths))
    written = LedgerLine.model_validate_json(paths.ledger.read_text().splitlines()[0])
    assert written.stand_in is not None and written == line
    # A reviewer's recomputation from the line and the lock alone.
    assert written.stand_in == seeded_draws(seeded_of(lock, written.model), written.cell_id)
    assert written.stand_in.seed == 2602
    # What the provider did: the drawn exploratory turns, then the drawn answer.
    assert len(commands) == written.stand_in.exploratory_turns + 1
    solve = (REPO_ROOT / "tasks" / cell.task / "solution" / "solve.sh").read_text()
    assert (commands[-1] == solve) is not written.stand_in.wrong_answer
    assert line.physical_posts == len(commands) + 1
    assert line.time_to_first_request_seconds is not None
    assert line.agent_after_first_request_seconds is not None
    assert 0 <= line.time_to_first_request_seconds < 5
    assert line.agent_after_first_request_seconds >= 0


def test_other_models_leave_no_draws_on_their_lines(
    paths: RunPaths, proxy: CredentialProxy, tmp_path: Path
) -> None:
    trials = tmp_path / "trials"
    demo = load_lock(REPO_ROOT / "locks" / "demo.toml")
    cell = build_schedule(demo).cells[0]
    guest = FakeTransport(conversing_harbor(proxy, [], trials), trials)
    line = runner_for(demo, paths, proxy, guest).run(cell, Ledger(paths))
    assert line.stand_in is None
    assert "stand_in" not in paths.ledger.read_text()
