"""``@hypervisor/<lab>``: this machine as the hypervisor of lab ``<lab>``, one pyinfra host per
lab, so a fleet inventory (inventory/fleet.py) can list several labs on one machine. pyinfra's
own ``@local`` is a single host; this is that connector under a name per lab. Registered as the
``hypervisor`` connector in pyproject.toml."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyinfra.connectors.local import LocalConnector
from typing_extensions import override

HYPERVISOR_GROUP = "hypervisors"


class LabHypervisorConnector(LocalConnector):
    @override
    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
        yield f"@hypervisor/{name}", {}, [HYPERVISOR_GROUP]
