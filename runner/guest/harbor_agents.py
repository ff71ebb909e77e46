"""Harbor installed agents for the lock's harnesses (``runner.guest.harbor_agents:PiAgent``).

Harbor builds the agent with the trial's agent kwargs (``--agent-kwarg``/``--ak`` or the trial
config): ``harness`` and ``model`` are the lock's entries (JSON), ``runtime_version`` the lock's
``tools.node`` or ``tools.bun``; ``artifacts_dir`` and ``proxy_base_url`` default to
``$BENCH_ARTIFACTS_DIR`` (else /bench/artifacts) and ``$BENCH_PROXY_BASE_URL``. The per-cell
bearer is read at run time from the Harbor process's own environment (``BENCH_PROXY_BEARER``),
never from an agent kwarg or ``--ae``: Harbor writes those into the trial's config.json, and it
redacts only names that look secret (KEY, TOKEN, ...), which this one does not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

from harbor.agents.installed.base import BaseInstalledAgent, with_prompt_template
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from runner.guest.agent_plan import (
    ARTIFACTS_ENV,
    DEFAULT_ARTIFACTS_DIR,
    PROXY_BASE_URL_ENV,
    AgentPlan,
    bearer_environment,
    install_script,
    run_script,
)
from runner.guest.harness_config import BEARER_ENV, Agent


class HarnessAgent(BaseInstalledAgent):
    """Installs one harness from the frozen artifacts and runs it on the task's instruction."""

    AGENT: ClassVar[Agent]

    def __init__(
        self,
        logs_dir: Path,
        harness: dict[str, Any] | str,
        model: dict[str, Any] | str,
        runtime_version: str,
        artifacts_dir: str | None = None,
        proxy_base_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.plan = AgentPlan.model_validate(
            {
                "harness": _json_object(harness),
                "model": _json_object(model),
                "runtime_version": runtime_version,
                "artifacts_dir": artifacts_dir
                or os.environ.get(ARTIFACTS_ENV, DEFAULT_ARTIFACTS_DIR),
                "proxy_base_url": proxy_base_url or os.environ.get(PROXY_BASE_URL_ENV, ""),
            }
        )
        if self.plan.harness.agent != self.AGENT:
            raise ValueError(f"harness {self.plan.harness.id} is not a {self.AGENT} harness")
        super().__init__(logs_dir, version=self.plan.harness.package.version, **kwargs)
        if self.model_name is not None and self.model_name != self.plan.model.label:
            raise ValueError(f"--model {self.model_name} is not the lock's {self.plan.model.label}")

    async def setup(self, environment: BaseEnvironment) -> None:
        """One exec: Harbor's own setup adds another before the install (its /installed-agent
        dir, which these agents never use), ~5 s each under TCG; the configuration is written by
        the run's exec (agent_plan.run_script)."""
        (self.logs_dir / "setup").mkdir(parents=True, exist_ok=True)
        try:
            await self.install(environment)
        except RuntimeError:
            raise
        except Exception as exc:  # as Harbor's own setup says it
            raise RuntimeError(f"Agent install failed: {exc}") from exc

    async def install(self, environment: BaseEnvironment) -> None:
        await self.exec_as_root(environment, install_script(self.plan))

    @with_prompt_template
    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        bearer = os.environ.get(BEARER_ENV)
        if not bearer:
            raise RuntimeError(f"{BEARER_ENV} is not set in the Harbor process's environment")
        await self.exec_as_agent(
            environment, run_script(self.plan, instruction), env=bearer_environment(bearer)
        )


class PiAgent(HarnessAgent):
    AGENT: ClassVar[Agent] = "pi"

    @staticmethod
    def name() -> str:
        return "bench-pi"


class OmpAgent(HarnessAgent):
    AGENT: ClassVar[Agent] = "omp"

    @staticmethod
    def name() -> str:
        return "bench-omp"


def _json_object(value: dict[str, Any] | str) -> Any:
    """Harbor passes ``--agent-kwarg key=<JSON>`` parsed, a trial config's YAML as is."""
    return json.loads(value) if isinstance(value, str) else value
