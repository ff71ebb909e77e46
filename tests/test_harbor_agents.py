"""Harbor agents for the harnesses: the scripts they run, Harbor loading them, and a whole cell.

The last test plays a cell without Podman or Harbor's loop: the agent's own install and run
scripts in the stand-in container (tests/support/standin_container; real Pi on Node and
OMP on Bun, from the host tool cache laid out as the guest's frozen artifacts), the harness
talking to the proxy and the offline scripted provider playing the task's reference solution,
then the verifier.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from runner.artifacts.hosttools import host_harness
from runner.cells.accounting import count_logical_attempts_in
from runner.guest.agent_plan import (
    CONTAINER,
    AgentPlan,
    bearer_environment,
    install_script,
    run_script,
)
from runner.guest.harness_config import BEARER_ENV
from runner.provider.script import reference_solution
from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths
from runner.spec.lock import Harness, Lock, load_lock
from tests.support.host_harnesses import with_host_omp
from tests.support.standin_container import TASKS, StandInContainer, needs_chroot

REPO = Path(__file__).resolve().parent.parent
SEED = load_lock(REPO / "locks" / "seed-54.toml")
DEMO = with_host_omp(load_lock(REPO / "locks" / "demo.toml"))
PROXY_URL = "http://host.containers.internal:8931/v1"


def plan_for(lock: Lock, harness_id: str, model_id: str) -> AgentPlan:
    harness = next(h for h in lock.harnesses if h.id == harness_id)
    model = next(m for m in lock.models if m.id == model_id)
    version = lock.tools.runtime_version(harness.runtime)
    return AgentPlan(
        harness=harness,
        model=model,
        runtime_version=version,
        artifacts_dir="/bench/artifacts",
        proxy_base_url=PROXY_URL,
    )


# (lock, harness, model) -> runtime dir, harness tree, command, models file, extension dirs
CASES = [
    (
        SEED,
        "bare-pi",
        "glm",
        "runtimes/node-22.23.5",
        "harnesses/bare-pi",
        "pi",
        "models.json",
        [],
    ),
    (
        SEED,
        "openpi",
        "luna",
        "runtimes/node-22.23.5",
        "harnesses/openpi",
        "pi",
        "models.json",
        ["@tt-a1i/openpi"],
    ),
    (SEED, "omp", "glm", "runtimes/bun-1.3.14", "harnesses/omp", "omp", "models.yml", []),
    (DEMO, "omp", "reference", "runtimes/bun-1.3.14", "harnesses/omp", "omp", "models.yml", []),
    (
        DEMO,
        "pi-openpi",
        "wrong",
        "runtimes/node-22.23.5",
        "harnesses/pi-openpi",
        "pi",
        "models.json",
        ["@tt-a1i/openpi"],
    ),
]


@pytest.mark.parametrize(
    (
        "lock",
        "harness_id",
        "model_id",
        "runtime_dir",
        "tree",
        "command",
        "models_file",
        "names",
    ),
    CASES,
)
def test_scripts_follow_the_lock(
    lock: Lock,
    harness_id: str,
    model_id: str,
    runtime_dir: str,
    tree: str,
    command: str,
    models_file: str,
    names: list[str],
) -> None:
    plan = plan_for(lock, harness_id, model_id)
    install = install_script(plan)
    harness_bin = f"/bench/artifacts/{tree}/node_modules/.bin"
    assert f"test -x {harness_bin}/{command}" in install
    assert "tar " not in install and "cp " not in install  # run in place, nothing unpacked

    run = run_script(plan, "Fix it.")
    configure = run[: run.index("mkdir -p /logs/agent/sessions")]  # before the harness starts
    assert f"> /opt/bench/agent/{models_file}" in configure
    words = shlex.split(configure)  # a word written to a file: the one before ">" and the file
    written = {words[i + 1]: words[i - 1] for i, word in enumerate(words) if word == ">"}
    assert " install " not in configure  # the extensions' registration is written, not run
    settings = written.get("/opt/bench/agent/settings.json")
    if names:  # each extension by its path from the agent dir (as `pi install` writes it)
        assert settings is not None
        packages = json.loads(settings)["packages"]
        assert packages == [f"../../../bench/artifacts/{tree}/node_modules/{n}" for n in names]
    else:
        assert settings is None
    models = json.loads(written[f"/opt/bench/agent/{models_file}"])
    provider = models["providers"][plan.model.provider]
    assert provider["baseUrl"] == PROXY_URL
    assert provider["apiKey"] == {"pi": f"${BEARER_ENV}", "omp": BEARER_ENV}[plan.harness.agent]
    assert provider["models"][0]["id"] == plan.model.model

    assert (
        f"{harness_bin}/{command} --session-dir /logs/agent/sessions "
        f"--mode json -p --provider {plan.model.provider} --model {plan.model.model} " in run
    )
    assert (
        "< /dev/null > /logs/agent/events.jsonl 2> /logs/agent/harness-stderr.txt "
        "|| harness_status=$?\n" in run
    )
    assert "> /logs/agent/agent-cgroup.json" in run and run.endswith('exit "$harness_status"')
    for script in (install, run):
        assert f'export PATH="/bench/artifacts/{runtime_dir}/bin:{harness_bin}:$PATH"' in script
        assert "export PI_CODING_AGENT_DIR=/opt/bench/agent" in script


def test_instruction_is_one_argument_whatever_it_holds() -> None:
    instruction = 'Don\'t run `rm -rf /`; echo "$HOME" $(id)\nsecond line'
    plan = plan_for(DEMO, "bare-pi", "reference")
    run = run_script(plan, instruction)
    words = shlex.split(run[run.index(f"{plan.command} --session-dir") :])
    assert words[words.index("<") - 1] == instruction


def test_the_bearer_is_only_in_the_run_environment() -> None:
    plan = plan_for(SEED, "openpi", "glm")
    bearer = "bench-bearer-" + os.urandom(8).hex()
    assert bearer_environment(bearer) == {BEARER_ENV: bearer}
    scripts = install_script(plan) + run_script(plan, "go")
    assert bearer not in scripts and "BEARER=" not in scripts


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"proxy_base_url": ""}, "proxy_base_url"),
        ({"artifacts_dir": "relative/dir"}, "artifacts_dir"),
        ({"runtime_version": "latest"}, "runtime_version"),
        (
            {
                "harness": {
                    "extensions": [{"source": "file:/x.tgz", "sha256": "sha256:" + "0" * 64}]
                }
            },
            "package 'name'",
        ),
        (
            {
                "harness": {
                    "id": "omp",
                    "agent": "omp",
                    "runtime": "bun",
                    "extensions": [{"source": "npm:openpi@0.3.0"}],
                }
            },
            "Pi harnesses only",
        ),
    ],
)
def test_plan_refuses_what_cannot_run_offline(change: dict[str, object], problem: str) -> None:
    data = plan_for(SEED, "openpi", "glm").model_dump(mode="json")
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ValidationError, match=problem):
        AgentPlan.model_validate(data)


_LOAD_WITH_HARBOR = """
import json, sys
from pathlib import Path
from harbor.agents.factory import AgentFactory
from harbor.models.trial.config import AgentConfig
kwargs, logs = json.loads(sys.argv[1]), Path(sys.argv[2])
for import_path, model_name in json.loads(sys.argv[3]):
    try:
        agent = AgentFactory.create_agent_from_config(
            AgentConfig(import_path=import_path, model_name=model_name, kwargs=kwargs),
            logs_dir=logs)
    except ValueError as error:
        print(json.dumps({"error": str(error).splitlines()[0]}))
        continue
    print(json.dumps({"name": agent.name(), "version": agent.version(),
                      "import_path": agent.import_path(),
                      "model": agent.to_agent_info().model_info.model_dump()}))
"""


# registry: the Harbor venv is pip-installed from PyPI (tests/support/harbor_venv.py).
@pytest.mark.registry
def test_harbor_loads_the_agents_by_import_path(tmp_path: Path, harbor_python: Path) -> None:
    lock = DEMO
    harness = next(h for h in lock.harnesses if h.id == "bare-pi")
    kwargs = {
        "harness": harness.model_dump(mode="json"),
        "model": lock.models[0].model_dump(mode="json"),
        "runtime_version": lock.tools.node,
        "proxy_base_url": PROXY_URL,
    }
    attempts = [
        ["runner.guest.harbor_agents:PiAgent", "scripted/reference-solution"],
        ["runner.guest.harbor_agents:PiAgent", "seal/glm-5.3"],
        ["runner.guest.harbor_agents:OmpAgent", "scripted/reference-solution"],
    ]
    done = subprocess.run(
        [
            str(harbor_python),
            "-c",
            _LOAD_WITH_HARBOR,
            json.dumps(kwargs),
            str(tmp_path),
            json.dumps(attempts),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    loaded, wrong_model, wrong_agent = (json.loads(line) for line in done.stdout.splitlines())
    assert loaded == {
        "name": "bench-pi",
        "version": "0.84.2",
        "import_path": "runner.guest.harbor_agents:PiAgent",
        "model": {"name": "reference-solution", "provider": "scripted"},
    }
    assert "is not the lock's scripted/reference-solution" in wrong_model["error"]
    assert "is not a omp harness" in wrong_agent["error"]


_SETUP_WITH_HARBOR = """
import asyncio, json, sys
from pathlib import Path
from harbor.agents.factory import AgentFactory
from harbor.environments.base import ExecResult
from harbor.models.trial.config import AgentConfig

class RecordingEnvironment:
    def __init__(self):
        self.execs = []
    async def exec(self, command, user=None, env=None, cwd=None, timeout_sec=None):
        self.execs.append({"command": command, "user": user})
        return ExecResult(stdout="", stderr="", return_code=0)

agent = AgentFactory.create_agent_from_config(
    AgentConfig(import_path=sys.argv[3], model_name=sys.argv[4], kwargs=json.loads(sys.argv[1])),
    logs_dir=Path(sys.argv[2]))
environment = RecordingEnvironment()
asyncio.run(agent.setup(environment))
print(json.dumps(environment.execs))
"""


# registry: the Harbor venv is pip-installed from PyPI (tests/support/harbor_venv.py).
@pytest.mark.registry
def test_harbor_sets_an_agent_up_in_one_exec_as_root(tmp_path: Path, harbor_python: Path) -> None:
    """Harbor 0.20.0's setup of these agents: the install script alone, as root (its own setup
    would first make /installed-agent in an exec of its own; the configuration is the run's)."""
    plan = plan_for(SEED, "openpi", "glm")
    kwargs = {
        "harness": plan.harness.model_dump(mode="json"),
        "model": plan.model.model_dump(mode="json"),
        "runtime_version": plan.runtime_version,
        "proxy_base_url": PROXY_URL,
    }
    done = subprocess.run(
        [str(harbor_python), "-c", _SETUP_WITH_HARBOR, json.dumps(kwargs), str(tmp_path),
         "runner.guest.harbor_agents:PiAgent", plan.model.label],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (only,) = json.loads(done.stdout)
    assert only == {"command": f"set -o pipefail; {install_script(plan)}", "user": "root"}
    assert (tmp_path / "setup").is_dir()


def _frozen_artifacts(root: Path, harness: Harness, runtime_version: str) -> Path:
    """The host's harness and runtime laid out as the guest's artifact directory."""
    installed = host_harness(harness, runtime_version)
    prefix = installed.command.parents[2]  # <prefix>/node_modules/.bin/<command>
    shutil.copytree(prefix, root / "harnesses" / harness.id, symlinks=True, copy_function=os.link)
    runtime_bin = root / "runtimes" / f"{harness.runtime}-{runtime_version}" / "bin"
    runtime_bin.mkdir(parents=True)
    os.link(installed.runtime, runtime_bin / harness.runtime)
    return root


# registry: the host's Pi and OMP, Node and Bun are npm-installed (runner.artifacts.hosttools).
@pytest.mark.registry
@needs_chroot
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the host tool cache is x86_64")
@pytest.mark.parametrize("harness_id", ["bare-pi", "omp"])
def test_a_cell_through_the_agent_scripts_earns_the_reward(
    harness_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = TASKS / "git-leak-recovery"
    harness = next(h for h in DEMO.harnesses if h.id == harness_id)
    runtime_version = DEMO.tools.runtime_version(harness.runtime)
    key_model = DEMO.models[0]
    monkeypatch.setenv(key_model.key_env, "sk-scripted-" + os.urandom(8).hex())
    container = StandInContainer.empty(tmp_path / "root")
    container.play_dockerfile(task / "environment")
    _frozen_artifacts(container.root / "bench" / "artifacts", harness, runtime_version)

    with CredentialProxy(RunPaths(tmp_path / "run")) as proxy:
        plan = AgentPlan(
            harness=harness,
            model=key_model,
            runtime_version=runtime_version,
            artifacts_dir="/bench/artifacts",
            proxy_base_url=proxy.base_url,
        )
        bearer = proxy.open_cell(
            "cell-1", key_model, datetime.now(UTC) + timedelta(minutes=5), reference_solution(task)
        )
        for script, environment in (
            (install_script(plan), None),
            (run_script(plan, (task / "instruction.md").read_text()), bearer_environment(bearer)),
        ):
            done = container.run(script, environment, timeout=300)
            assert done.returncode == 0, "\n".join(container.log)
        counts = proxy.close_cell("cell-1")

    events = container.root / CONTAINER.event_log.relative_to("/")
    assert count_logical_attempts_in(events).logical_attempts == counts.physical_posts == 2
    assert bearer not in "\n".join(container.log)
    for kept in (container.root / "logs" / "agent").rglob("*"):
        assert not kept.is_file() or bearer.encode() not in kept.read_bytes(), kept
    container.copy_in(task / "tests", "/tests")
    container.run("/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1")
    assert container.reward() == "1", (container.root / "logs/verifier/test-stdout.txt").read_text()
