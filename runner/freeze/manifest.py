"""The freeze manifest: the guest's state at ``runner freeze``, which ``runner verify`` audits.

A file entry is ``sha256:<hex>`` (a regular file's content) or ``symlink:<target>``. A tree is
recorded as its listing: one ``<relative path>\\t<entry>`` line per file, sorted bytewise; the
listing's sha256 is what the audit compares, the per-file map names the
drifted files. The manifest's own digest is the sha256 of its canonical JSON.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import InputError, describe_validation_error
from runner.core.models import FrozenModel, Sha256, Slug
from runner.spec.tasks import TaskDerivation

SCHEMA_VERSION: Literal[1] = 1
SCOPE_RESOURCE = "freeze/scope.toml"

AbsolutePath = Annotated[str, Field(pattern=r"^/\S*$")]
# What a file is: its content digest, or where a symlink points.
FileEntry = Annotated[str, Field(pattern=r"^(sha256:[0-9a-f]{64}|symlink:.*)$")]


# An nftables table as nft names it: "<family> <name>".
NftTable = Annotated[str, Field(pattern=r"^(ip|ip6|inet|arp|bridge|netdev) [A-Za-z0-9_-]+$")]
# A unit's process as frozen: its pid, and whether it waits (a reset restores both).
WaitingEntry = Annotated[str, Field(pattern=r"^pid \d+ (waiting|not waiting)$")]
# A loaded table: the sha256 of its rules as listed, or "absent".
NftEntry = Annotated[str, Field(pattern=r"^(sha256:[0-9a-f]{64}|absent)$")]


class FreezeScope(FrozenModel):
    """Which paths are frozen (see runner/freeze/scope.toml for the meaning of each field)."""

    LATE_FIELDS = frozenset({"nft_tables", "waiting_units"})

    files: tuple[str, ...]
    trees: tuple[AbsolutePath, ...]
    task_roots: tuple[AbsolutePath, ...] = ()
    tree_excludes: tuple[str, ...] = ()
    venv_roots: tuple[AbsolutePath, ...] = ()
    venv_search_depth: int = Field(default=3, ge=1, le=8)
    nft_tables: tuple[NftTable, ...] = ()
    # systemd unit -> the FIFO that exists while its process waits for a cell (warm Harbor).
    waiting_units: dict[str, AbsolutePath] = Field(default_factory=dict)


class Tree(FrozenModel):
    listing_sha256: Sha256
    files: dict[str, FileEntry]  # path relative to the tree's root -> entry

    @model_validator(mode="after")
    def _digest_matches_files(self) -> Tree:
        if listing_digest(self.files) != self.listing_sha256:
            raise ValueError("listing_sha256 does not match the files listed")
        return self

    @classmethod
    def of(cls, files: dict[str, str]) -> Tree:
        return cls(listing_sha256=listing_digest(files), files=files)


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
    files: dict[AbsolutePath, FileEntry]
    trees: dict[AbsolutePath, dict[str, FileEntry]]
    venvs: dict[AbsolutePath, tuple[str, ...]]  # venv -> `pip freeze --all` lines
    images: tuple[PodmanImage, ...]
    listening: tuple[Socket, ...]
    nft_tables: dict[NftTable, NftEntry] = Field(default_factory=dict)
    waiting: dict[str, WaitingEntry] = Field(default_factory=dict)


class GuestState(FrozenModel):
    LATE_FIELDS = frozenset({"nft_tables", "waiting"})

    kernel: str
    packages: dict[str, str]
    files: dict[AbsolutePath, FileEntry]
    trees: dict[AbsolutePath, Tree]
    tasks: dict[AbsolutePath, Sha256]  # each child of a task root -> its own listing digest
    venvs: dict[AbsolutePath, tuple[str, ...]]
    images: tuple[PodmanImage, ...]
    listening: tuple[Socket, ...]
    nft_tables: dict[NftTable, NftEntry] = Field(default_factory=dict)
    # Each waiting unit of the scope: "pid <n> waiting", else "pid <n> not waiting".
    waiting: dict[str, WaitingEntry] = Field(default_factory=dict)

    @classmethod
    def of(cls, collected: Collected, scope: FreezeScope) -> GuestState:
        fields = collected.model_dump(exclude={"trees", "images", "listening"})
        return cls(
            **fields,
            trees={root: Tree.of(files) for root, files in collected.trees.items()},
            tasks=_task_digests(collected.trees, scope.task_roots),
            images=collected.images,
            listening=collected.listening,
        )


class OracleScore(FrozenModel):
    """A task's reference solution through Harbor's oracle agent at the freeze (runner.freeze.
    oracle): the freeze happened only because every one scored 1."""

    task: Slug
    reward: float
    seconds: float = Field(ge=0)
    # A timing-sensitive task's oracle under emulation may score 0 without failing the freeze
    # (lock tasks.timing_sensitive): then the lab cannot judge the task, and says why.
    verifier_last_lines: str = ""

    LATE_FIELDS = frozenset({"verifier_last_lines"})

    @property
    def judges(self) -> bool:
        """Whether this lab can tell the task's success from its failure."""
        return self.reward == 1


class FreezeManifest(FrozenModel):
    LATE_FIELDS = frozenset({"tasks", "oracle"})

    schema_version: Literal[1] = SCHEMA_VERSION
    lab: Slug
    environment_fingerprint: Sha256
    scope: FreezeScope
    state: GuestState
    # With the lock given to `runner freeze`: the tasks as the lab runs them (runner.spec.tasks)
    # and the oracle's score of each.
    tasks: tuple[TaskDerivation, ...] = ()
    oracle: tuple[OracleScore, ...] = ()

    @property
    def sha256(self) -> str:
        return sha256_digest(canonical_json(self))


def _task_digests(trees: dict[str, dict[str, str]], task_roots: tuple[str, ...]) -> dict[str, str]:
    digests: dict[str, str] = {}
    for root in task_roots:
        by_task: dict[str, dict[str, str]] = {}
        for path, entry in trees.get(root, {}).items():
            task, _, rest = path.partition("/")
            by_task.setdefault(task, {})[rest] = entry
        for task, files in by_task.items():
            digests[f"{root}/{task}"] = listing_digest(files)
    return digests


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
    text = resources.files("runner").joinpath(SCOPE_RESOURCE).read_text()
    try:
        return FreezeScope.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError) as error:
        detail = (
            describe_validation_error(SCOPE_RESOURCE, error)
            if isinstance(error, ValidationError)
            else f"{SCOPE_RESOURCE}: {error}"
        )
        raise InputError(detail) from None
