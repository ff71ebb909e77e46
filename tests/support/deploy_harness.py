"""Shared by the deploy tests: a pyinfra ``@local`` host with data, and running one operation."""

from __future__ import annotations

from typing import Any

from pyinfra.api.command import PyinfraCommand
from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state


def local_host(data: dict[str, Any]) -> Host:
    state = State(Inventory((["@local"], data)), Config())  # type: ignore[no-untyped-call]
    host: Host = state.inventory.get_host("@local")
    return host


def yielded(host: Host, op: Any, **args: Any) -> list[PyinfraCommand]:
    """What ``op`` yields on ``host`` (its generator, as pyinfra runs it), without executing."""
    with ctx_state.use(host.state), ctx_host.use(host):
        return list(op._inner(**args))
