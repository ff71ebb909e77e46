"""What the lab reads of a task's ``task.toml``, in both of Harbor's forms.

Terminal-Bench 2.0 writes ``version = "1.0"`` with the sizes as strings (``memory = "2G"``);
Terminal-Bench 2.1 writes ``schema_version = "1.1"``, ``memory_mb`` and ``allow_internet``.
Harbor reads both (``version`` is its old name for ``schema_version``); so does this. The lab
uses the build timeout (each task image's build is bounded by it) and records the rest in
``tasks.json``: the network a task asks for is recorded, never granted (the lab is offline for
every task: its containers reach only the lab's own mirror and proxy).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from runner.core.errors import InputError
from runner.core.models import FrozenModel

# Harbor 0.20.0's defaults (harbor/models/task/config.py) where task.toml says nothing.
HARBOR_BUILD_TIMEOUT_SEC = 600.0
HARBOR_NETWORK = "public"
NetworkMode = Literal["public", "no-network", "allowlist"]


class TaskSettings(FrozenModel):
    """A task's own settings, as its task.toml gives them (or Harbor's defaults, said so)."""

    schema_version: str = Field(description="task.toml's schema_version, or its older 'version'")
    build_timeout_sec: float = Field(gt=0, description="its image's build is bounded by this")
    network: NetworkMode = Field(description="the network the task asks for (never granted)")
    network_from: str = Field(description="the task.toml line it comes from, or Harbor's default")
    agent_timeout_sec: float | None = None
    verifier_timeout_sec: float | None = None


def read_task_settings(task: Path) -> TaskSettings:
    """The settings of the task directory ``task``; a task.toml that is not TOML, or a value of
    the wrong type, is one line naming the task."""
    toml = task / "task.toml"
    try:
        table = tomllib.loads(toml.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"task {task.name}: no task.toml") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"task {task.name}: task.toml cannot be read: {error}") from None
    environment = _table(table, "environment", task.name)
    try:
        return TaskSettings(
            schema_version=str(table.get("schema_version", table.get("version", "unstated"))),
            build_timeout_sec=environment.get("build_timeout_sec", HARBOR_BUILD_TIMEOUT_SEC),
            **_network(environment, task.name),
            agent_timeout_sec=_table(table, "agent", task.name).get("timeout_sec"),
            verifier_timeout_sec=_table(table, "verifier", task.name).get("timeout_sec"),
        )
    except ValueError as error:
        first = str(error).splitlines()
        raise InputError(f"task {task.name}: task.toml: {' '.join(first[:3])}") from None


def _table(table: dict[str, Any], name: str, task: str) -> dict[str, Any]:
    value = table.get(name, {})
    if not isinstance(value, dict):
        raise InputError(f"task {task}: task.toml: [{name}] is not a table")
    return value


def _network(environment: dict[str, Any], task: str) -> dict[str, Any]:
    """Harbor's rule: ``network_mode`` wins; the older ``allow_internet`` maps true to public and
    false to no-network; neither: public."""
    if "network_mode" in environment:
        mode = environment["network_mode"]
        return {"network": mode, "network_from": f'network_mode = "{mode}"'}
    allowed = environment.get("allow_internet")
    if allowed is None:
        return {"network": HARBOR_NETWORK, "network_from": "Harbor's default (task.toml is silent)"}
    if not isinstance(allowed, bool):
        raise InputError(f"task {task}: task.toml: allow_internet must be true or false")
    return {
        "network": "public" if allowed else "no-network",
        "network_from": f"allow_internet = {str(allowed).lower()}",
    }
