"""``runner fleet server|worker``: a loopback Temporal server, and a fleet host's worker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click

from runner.core.roots import cache_root
from runner.fleet.host import HostWorker, serve_host
from runner.fleet.server import dev_server_command
from runner.run.execute import FrozenLab, take_provider_keys
from runner.spec.fleet import load_fleet
from runner.spec.resolution import load_resolved_lock

fleet_file = click.option(
    "--fleet",
    "fleet_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The fleet file (fleets/*.toml): the Temporal server and the hosts.",
)


@click.group("fleet")
def fleet_command() -> None:
    """Batches on many hosts, through Temporal: each host runs a worker, a controller runs
    ``runner execute LOCK --fleet FLEET``."""


@fleet_command.command("server")
@click.option("--port", default=7233, show_default=True, help="The loopback port of its frontend.")
@click.option(
    "--store",
    type=click.Path(path_type=Path, dir_okay=False),
    default=lambda: cache_root() / "temporal" / "dev.sqlite",
    show_default=".cache/temporal/dev.sqlite",
    help="Its SQLite store: workflows and their histories outlive the server.",
)
def server_command(port: int, store: Path) -> None:
    """A Temporal server on 127.0.0.1 for one machine (``temporal server start-dev``), in the
    foreground until Ctrl-C. A fleet of machines needs a Temporal cluster (README)."""
    store.parent.mkdir(parents=True, exist_ok=True)
    command = dev_server_command(port, store)
    os.execv(command[0], command)


@fleet_command.command("worker")
@fleet_file
@click.option("--host", "host_name", required=True, help="This host's name in the fleet file.")
@click.option(
    "--lock",
    "lock_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The lock whose models' keys this worker takes from its environment.",
)
def worker_command(fleet_path: Path, host_name: str, lock_path: Path) -> None:
    """Run this host's cells: poll its task queue, one activity at a time, on its lab.

    The lock's provider keys are taken from this process's environment at start and held by
    the host's proxy; they never travel through Temporal."""
    fleet = load_fleet(fleet_path)
    host = fleet.host(host_name)
    lock = load_resolved_lock(lock_path)
    worker = HostWorker(
        host=host,
        keys=take_provider_keys(lock),
        load_lab=lambda: FrozenLab.load(host.lab),
        staging_root=cache_root() / "fleet" / host.name,
    )
    click.echo(f"host {host.name}: lab {host.lab}, polling {host.queue} at {fleet.temporal}")
    asyncio.run(serve_host(fleet, worker))
