"""A fleet file: the VM hosts a run may spread its batches over, and the Temporal server that
dispatches them (runner.fleet). Read by the controller (``runner execute --fleet``), by each
host's worker (``runner fleet worker``) and by the fleet inventory (``inventory/fleet.py``), so
the three agree on the names.

    temporal = "127.0.0.1:7233"      # the Temporal frontend every worker and the controller reach
    [[hosts]]
    name = "a"                        # the host's worker polls the task queue named after it
    lab = "fleet-a"                   # the lab (lab.json, freeze) that host's worker runs cells in
    ssh = "root@hv-a.example"         # how the controller reaches the host; absent: this machine

One host is one lab and one worker: a host's cells run one at a time on its lab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from runner.core.errors import InputError
from runner.core.files import read_toml_model
from runner.core.models import FrozenModel, Slug

QUEUE_PREFIX = "frozen-bench"


class FleetHost(FrozenModel):
    name: Slug
    lab: Slug
    ssh: str | None = Field(
        default=None, description="user@hostname the controller reaches the host by (SFTP)"
    )

    @property
    def queue(self) -> str:
        """The host's own Temporal task queue: only its worker polls it."""
        return f"{QUEUE_PREFIX}-host-{self.name}"


class Fleet(FrozenModel):
    schema_version: Literal[1] = 1
    temporal: str = "127.0.0.1:7233"
    namespace: str = "default"
    hosts: tuple[FleetHost, ...] = Field(min_length=1)

    @field_validator("hosts")
    @classmethod
    def _distinct(cls, hosts: tuple[FleetHost, ...]) -> tuple[FleetHost, ...]:
        for what in ("name", "lab"):
            values = [getattr(host, what) for host in hosts]
            twice = sorted({value for value in values if values.count(value) > 1})
            if twice:
                raise ValueError(f"two hosts share the {what} {', '.join(twice)}")
        return hosts

    def host(self, name: str) -> FleetHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InputError(f"no host {name} in the fleet (hosts: {self.names})")

    @property
    def names(self) -> str:
        return ", ".join(host.name for host in self.hosts)


def load_fleet(path: Path) -> Fleet:
    """Read and validate a fleet file; every problem becomes one ``InputError`` line."""
    return read_toml_model(path, Fleet, "fleet")
