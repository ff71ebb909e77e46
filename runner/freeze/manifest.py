"""The freeze manifest: the guest's state at ``runner freeze``, which ``runner verify`` audits.

The disk is summarised here and recorded whole in the disk inventory beside the manifest
(runner.freeze.inventory), whose sha256 the summary holds; the live state (runner.freeze.live) is
recorded here. A task tree's digest is that of its listing: one ``<relative path>\\t<entry>`` line
per path, sorted bytewise. The manifest's own digest is the sha256 of its canonical JSON.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import InputError, describe_validation_error
from runner.core.models import FrozenModel, Sha256, Slug
from runner.freeze.inventory import DiskInventory, Observed
from runner.spec.task_derivation import TaskDerivation

# 2: the whole disk read on the host and the live state (the scope's files, trees and venvs of
# schema 1 are gone): a lab frozen with schema 1 must be frozen again.
SCHEMA_VERSION: Literal[2] = 2
SCOPE_RESOURCE = "freeze/scope.toml"

AbsolutePath = Annotated[str, Field(pattern=r"^/\S*$")]
# An nftables table as nft names it: "<family> <name>".
NftTable = Annotated[str, Field(pattern=r"^(ip|ip6|inet|arp|bridge|netdev) [A-Za-z0-9_-]+$")]
# A unit's process as frozen: its pid, and whether it waits (a reset restores both).
WaitingEntry = Annotated[str, Field(pattern=r"^pid \d+ (waiting|not waiting)$")]
# A loaded table: the sha256 of its rules as listed, or "absent".
NftEntry = Annotated[str, Field(pattern=r"^(sha256:[0-9a-f]{64}|absent)$")]


class Exclusion(FrozenModel):
    """One thing the live state leaves out: what it applies to, what identifies it (never a
    name or path pattern a change could take), and why leaving it out hides nothing."""

    applies_to: Literal["process", "unit", "cgroup", "mount", "tmpfs", "neighbour", "manager"]
    identity: str = Field(min_length=1)
    reason: str = Field(min_length=1)


# The glob exclusions of freezes before #23: read from their manifests (an old freeze is
# audited as it was made), refused in the scope file (runner/freeze/scope.toml).
LEGACY_GLOB_FIELDS = (
    "mount_excludes",
    "unit_excludes",
    "process_exe_excludes",
    "process_cgroup_excludes",
)


class FreezeScope(FrozenModel):
    """What is left out and what is named (see runner/freeze/scope.toml for each field)."""

    LATE_FIELDS = frozenset(
        {
            "ssh_session_executable",
            "ssh_listener_executable",
            "podman_graph_root",
            "session_runtime_files",
            "tmpfs_content_volatile",
            "manager_volatile",
            "neighbour_states",
            "slower_ratio",
            "slower_min_seconds",
            "exclusions",
        }
    )

    disk_excludes: tuple[AbsolutePath, ...]
    task_roots: tuple[AbsolutePath, ...] = ()
    nft_tables: tuple[NftTable, ...] = ()
    sysctl_volatile: tuple[str, ...] = ()
    mount_excludes: tuple[str, ...] = ()
    unit_excludes: tuple[str, ...] = ()
    process_exe_excludes: tuple[str, ...] = ()
    process_cgroup_excludes: tuple[str, ...] = ()
    # systemd unit -> the FIFO that exists while its process waits for a cell (warm Harbor).
    waiting_units: dict[str, AbsolutePath] = Field(default_factory=dict)
    # Identities of what the live state leaves out (runner.freeze.live): SSH's per-connection
    # server and its listener, by executable and process tree; Podman's storage.
    ssh_session_executable: AbsolutePath | Literal[""] = ""
    ssh_listener_executable: AbsolutePath | Literal[""] = ""
    podman_graph_root: AbsolutePath | Literal[""] = ""
    # Files of an identified login session on the tmpfs mounts: "{session}" is its logind id.
    session_runtime_files: tuple[AbsolutePath, ...] = ()
    # tmpfs files whose contents move (their type, mode and owner are still compared).
    tmpfs_content_volatile: tuple[AbsolutePath, ...] = ()
    # systemd manager properties (names; `*` any run) that move by themselves.
    manager_volatile: tuple[str, ...] = ()
    # Neighbour table states recorded (the others are the kernel's cache).
    neighbour_states: tuple[str, ...] = ()
    # An audit's probe or live reading slower than ``slower_ratio`` x its frozen figure (and
    # by at least ``slower_min_seconds``) is a drift of class ``slower`` (0: not compared).
    slower_ratio: float = Field(default=0.0, ge=0)
    slower_min_seconds: float = Field(default=0.0, ge=0)
    exclusions: dict[str, Exclusion] = Field(default_factory=dict)


class PodmanImage(FrozenModel):
    id: str = Field(pattern=r"^[0-9a-f]{64}$")
    digest: str
    names: tuple[str, ...]


class Socket(FrozenModel):
    """A listening socket as ``tcp/22``: protocol and port, no address, no ephemeral ports."""

    proto: Literal["tcp", "udp"]
    port: int = Field(ge=1, le=65535)

    @property
    def label(self) -> str:
        return f"{self.proto}/{self.port}"


class Collected(FrozenModel):
    """What the collection script in the guest prints (runner/guest/collect_state.py)."""

    kernel: str
    packages: dict[str, str]  # dpkg "name" or "name:arch" -> version (+ " [status]" unless ii)
    images: tuple[PodmanImage, ...]
    listening: tuple[Socket, ...]
    nft_tables: dict[NftTable, NftEntry] = Field(default_factory=dict)
    waiting: dict[str, WaitingEntry] = Field(default_factory=dict)


class DiskSummary(FrozenModel):
    """The frozen disk as the host read it: the inventory file's digest (``disk-inventory.json``
    beside the manifest, runner.freeze.inventory) and what it covers."""

    inventory_sha256: Sha256
    paths: int = Field(ge=0)
    regular_files: int = Field(ge=0)
    packages: int = Field(ge=0, description="installed packages whose files are checked")
    package_files: int = Field(ge=0, description="files checked against their package's digest")
    # Package files that differed from their package at the freeze (a configured conffile, a
    # path dpkg's filters kept out): each is named in the inventory's ``deviations``.
    package_deviations: int = Field(ge=0)

    @classmethod
    def of(cls, inventory: DiskInventory, observed: Observed) -> DiskSummary:
        return cls(
            inventory_sha256=inventory.sha256,
            paths=len(inventory.entries),
            regular_files=sum(entry.startswith("file ") for entry in inventory.entries.values()),
            packages=len({file.package for file in observed.packages.values()}),
            package_files=len(observed.packages),
            package_deviations=len(inventory.deviations),
        )


class SpeedFigures(FrozenModel):
    """A short fixed probe of the guest's speed (runner.freeze.live.SPEED_COMMAND) and how long
    reading the live state took: at the freeze, the figures every audit is compared with."""

    cpu_seconds: float = Field(ge=0)
    disk_seconds: float = Field(ge=0)
    live_seconds: float = Field(ge=0)


class GuestState(FrozenModel):
    LATE_FIELDS = frozenset({"speed"})

    kernel: str
    packages: dict[str, str]
    disk: DiskSummary
    tasks: dict[AbsolutePath, Sha256]  # each child of a task root -> its own listing digest
    images: tuple[PodmanImage, ...]
    listening: tuple[Socket, ...]
    nft_tables: dict[NftTable, NftEntry] = Field(default_factory=dict)
    # Each waiting unit of the scope: "pid <n> waiting", else "pid <n> not waiting".
    waiting: dict[str, WaitingEntry] = Field(default_factory=dict)
    # runner.freeze.live: category -> key -> value, as its command printed them.
    live: dict[str, dict[str, str]]
    speed: SpeedFigures | None = None

    @classmethod
    def of(
        cls,
        collected: Collected,
        live: dict[str, dict[str, str]],
        inventory: DiskInventory,
        observed: Observed,
        scope: FreezeScope,
        speed: SpeedFigures | None = None,
    ) -> GuestState:
        return cls(
            **collected.model_dump(),
            disk=DiskSummary.of(inventory, observed),
            tasks=task_digests(inventory.entries, scope.task_roots),
            live=live,
            speed=speed,
        )


class OracleScore(FrozenModel):
    """A task's reference solution through Harbor's oracle agent at the freeze (runner.freeze.
    oracle): the freeze happened only because every one scored 1."""

    task: Slug
    reward: float
    seconds: float = Field(ge=0)
    # A tolerated task's oracle may score 0 without failing the freeze (lock tasks.tolerated:
    # timing-sensitive under emulation, or it needs the network): then the lab cannot judge the
    # task, and says why.
    verifier_last_lines: str = ""
    # Harbor's own words for how its trial ended (its exception, or why no result.json was read).
    harbor_said: str = ""
    # Why the lock lets this task's oracle fail here ("" : it must score 1).
    tolerated: str = ""

    LATE_FIELDS = frozenset({"verifier_last_lines", "harbor_said", "tolerated"})

    @property
    def judges(self) -> bool:
        """Whether this lab can tell the task's success from its failure."""
        return self.reward == 1


class FreezeManifest(FrozenModel):
    LATE_FIELDS = frozenset({"tasks", "oracle"})

    schema_version: Literal[2] = SCHEMA_VERSION
    lab: Slug
    environment_fingerprint: Sha256
    scope: FreezeScope
    state: GuestState
    # With the lock given to `runner freeze`: the tasks as the lab runs them
    # (runner.spec.task_derivation) and the oracle's score of each.
    tasks: tuple[TaskDerivation, ...] = ()
    oracle: tuple[OracleScore, ...] = ()

    @property
    def sha256(self) -> str:
        return sha256_digest(canonical_json(self))


def task_digests(entries: dict[str, str], task_roots: tuple[str, ...]) -> dict[str, str]:
    """Each child of a task root -> the listing digest of the inventory entries below it."""
    by_task: dict[str, dict[str, str]] = {}
    for root in task_roots:
        prefix = root.rstrip("/") + "/"
        for path, entry in entries.items():
            if path.startswith(prefix):
                task, _, rest = path.removeprefix(prefix).partition("/")
                by_task.setdefault(prefix + task, {})
                if rest:
                    by_task[prefix + task][rest] = entry
    return {task: listing_digest(files) for task, files in by_task.items()}


def listing_text(files: dict[str, str]) -> str:
    """The canonical listing of a tree, what both the freeze and the audit hash: one
    ``path\\tentry\\n`` line per file in bytewise order (as ``LC_ALL=C sort`` gives)."""
    lines = (
        f"{path}\t{entry}\n".encode("utf-8", "surrogateescape") for path, entry in files.items()
    )
    return b"".join(sorted(lines)).decode("utf-8", "surrogateescape")


def listing_digest(files: dict[str, str]) -> str:
    return sha256_digest(listing_text(files).encode("utf-8", "surrogateescape"))


def default_scope() -> FreezeScope:
    return scope_of(resources.files("runner").joinpath(SCOPE_RESOURCE).read_text())


def scope_of(text: str) -> FreezeScope:
    """A scope file's text as the scope; a glob exclusion (LEGACY_GLOB_FIELDS) is refused."""
    try:
        scope = FreezeScope.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError) as error:
        detail = (
            describe_validation_error(SCOPE_RESOURCE, error)
            if isinstance(error, ValidationError)
            else f"{SCOPE_RESOURCE}: {error}"
        )
        raise InputError(detail) from None
    if globs := [name for name in LEGACY_GLOB_FIELDS if getattr(scope, name)]:
        raise InputError(
            f"{SCOPE_RESOURCE}: {', '.join(globs)}: exclusions by glob are gone (a change could "
            "enter them); name an identity under [exclusions]"
        )
    return scope
