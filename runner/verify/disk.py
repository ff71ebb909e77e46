"""The disk half of the audit: the guest's whole disk, read on the host, against the freeze.

Two comparisons, both complete by construction:
- every path's entry (runner.freeze.inventory: type, mode, owner, content digest, symlink target,
  extended attributes) against the freeze's disk inventory: a path added, removed or changed;
- every file of every installed package against the package's own digest (dpkg's md5sums and
  conffile md5s, as ``dpkg --verify`` checks them), unless it already differed at the freeze in
  exactly this way (the inventory's ``deviations``).

A drift of a package's file is named ``package:<package><path>``, any other ``disk:<path>``;
``expected`` and ``found`` are the two entries (and the md5s, for a package's file). The report
keeps the first ``MAX_PER_KIND`` drifts of each kind (added, removed, content, metadata, with or
without a package) and counts the rest; all of them are in the audit's ``disk-drifts.json``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import InputError
from runner.core.files import read_model, write_model
from runner.core.models import FrozenModel
from runner.freeze.inventory import DiskInventory, Observed, PackageFile, read_disk
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.freeze.record import GUEST_WAIT_SECONDS
from runner.lab.disk import DiskError, mounted_disk, quiesced_copy
from runner.lab.snapshot import SavedState, running_disk
from runner.lab.state import LabState
from runner.lab.transport import SshTransport
from runner.verify.report import Drift

ABSENT = "absent"
MAX_PER_KIND = 20
DRIFTS_FILE = "disk-drifts.json"


class DiskDrifts(FrozenModel):
    """Every drift the disk comparison found (the report keeps the first of each kind)."""

    drifts: tuple[Drift, ...]


@dataclass(frozen=True)
class DiskCheck:
    """The freeze's inventory, and how to read the guest's disk now: ``read`` calls its argument
    once the moment it reads is taken and the guest runs on (the audit's guest side may start
    then), or not at all if it fails before."""

    inventory: DiskInventory
    read: Callable[[Callable[[], None]], Observed]


def load_inventory(path: Path, manifest: FreezeManifest) -> DiskInventory:
    """The disk inventory of ``manifest``'s freeze: its digest must be the manifest's."""
    inventory = read_model(path, DiskInventory)
    if inventory.sha256 != manifest.state.disk.inventory_sha256:
        raise InputError(
            f"{path} is not the disk inventory of freeze {manifest.sha256}: run `runner freeze`"
        )
    return inventory


def lab_disk(lab: LabState, manifest: FreezeManifest, saved: SavedState) -> DiskCheck:
    """The lab's disk check: a copy of the running guest's live layer, taken while the guest
    held its filesystem frozen (runner.lab.disk), against the freeze's inventory."""
    inventory = load_inventory(FreezePaths.for_lab(lab.lab).disk_inventory, manifest)

    def read(captured: Callable[[], None]) -> Observed:
        layer = running_disk(lab)
        if layer != saved.live_disk:
            raise DiskError(
                f"the lab domain writes to {layer}, not to the freeze's live layer "
                f"{saved.live_disk} (was it started from its own definition?)"
            )
        with ExitStack() as stack:
            with SshTransport.for_lab(lab).connect(GUEST_WAIT_SECONDS) as guest:
                copy = stack.enter_context(quiesced_copy(guest, Path(layer)))
            captured()
            disk = stack.enter_context(mounted_disk(copy))
            return read_disk(disk, manifest.scope.disk_excludes)

    return DiskCheck(inventory=inventory, read=read)


def _kind(expected: str, found: str, owner: PackageFile | None) -> str:
    if expected == ABSENT:
        kind = "added"
    elif found == ABSENT:
        kind = "removed"
    elif _content(expected) != _content(found):
        kind = "content"
    else:
        kind = "metadata"
    return f"package file {kind}" if owner else f"path {kind}"


def _content(entry: str) -> str:
    """What an entry says of content: a file's digest, a symlink's target, a device's number."""
    words = entry.split(" ")
    head = 3 if words[0] in ("file", "char", "block", "dir", "fifo", "socket") else 2
    return " ".join(w for w in words[head:] if not w.startswith("xattr:")) + f" ({words[0]})"


def _check(path: str, owner: PackageFile | None) -> str:
    return f"package:{owner.package}{path}" if owner else f"disk:{path}"


def _with_md5(entry: str, md5: str | None) -> str:
    return f"{entry} (md5 {md5})" if md5 else entry


def disk_drifts(frozen: DiskInventory, observed: Observed) -> Iterator[tuple[str, Drift]]:
    """(kind, drift) of every path that differs from the freeze, in path order."""
    drifted: set[str] = set()
    for path in sorted(frozen.entries.keys() | observed.entries.keys()):
        expected = frozen.entries.get(path, ABSENT)
        found = observed.entries.get(path, ABSENT)
        if expected == found:
            continue
        owner = observed.packages.get(path)
        drifted.add(path)
        yield (
            _kind(expected, found, owner),
            Drift(
                check=_check(path, owner),
                expected=_with_md5(expected, owner.md5 if owner else None),
                found=_with_md5(found, observed.package_md5.get(path)),
            ),
        )
    for path, owner in sorted(observed.packages.items()):
        md5 = observed.package_md5.get(path, ABSENT)
        as_frozen = frozen.deviations.get(path) == f"{owner.package} md5 {owner.md5} {md5}"
        if md5 == owner.md5 or as_frozen or path in drifted:
            continue
        yield (
            "package digest",
            Drift(
                check=_check(path, owner),
                expected=f"md5 {owner.md5} (package {owner.package}'s)",
                found=f"md5 {md5}",
            ),
        )


def disk_checks(observed: Observed) -> list[str]:
    """What the disk comparison covered: each top-level directory, each package."""
    tops = {"/" + path.split("/")[1] for path in observed.entries}
    packages = {file.package for file in observed.packages.values()}
    return [f"disk:{top}" for top in sorted(tops)] + [f"package:{p}" for p in sorted(packages)]


def audit_disk(
    check: DiskCheck, evidence: Path, captured: Callable[[], None]
) -> tuple[list[str], list[Drift], int]:
    """(checks, the drifts the report keeps, paths read); every drift goes to ``evidence``.
    ``captured`` is called once the moment read is taken (``DiskCheck``)."""
    observed = check.read(captured)
    by_kind: dict[str, list[Drift]] = defaultdict(list)
    for kind, drift in disk_drifts(check.inventory, observed):
        by_kind[kind].append(drift)
    every = [drift for drifts in by_kind.values() for drift in drifts]
    write_model(evidence / DRIFTS_FILE, DiskDrifts(drifts=tuple(every)))
    kept: list[Drift] = []
    for kind, drifts in sorted(by_kind.items()):
        kept.extend(drifts[:MAX_PER_KIND])
        if len(drifts) > MAX_PER_KIND:
            kept.append(
                Drift(
                    check=f"disk:({kind}: {len(drifts) - MAX_PER_KIND} more)",
                    expected=f"the first {MAX_PER_KIND} are listed",
                    found=f"{len(drifts)} in all, every one in {evidence / DRIFTS_FILE}",
                )
            )
    return disk_checks(observed), kept, len(observed.entries)
