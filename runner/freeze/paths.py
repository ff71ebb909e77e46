"""FreezePaths owns the freeze's files in a lab's controller dir; no other code names them.

<repo>/.cache/lab/<lab>/          (LabPaths: lab.json and the SSH key are deploy's)
    freeze.json                   FreezeManifest: the guest's state at the last freeze
    disk-inventory.json           DiskInventory: every path of the frozen disk (its sha256 is
                                  in freeze.json)
    snapshot.json                 SavedState: the memory image and disk layers reset uses
    verify/<ident>/               one audit without a run dir (see runner/verify/audit.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.lab.state import LabPaths


@dataclass(frozen=True)
class FreezePaths:
    lab_dir: Path

    @classmethod
    def for_lab(cls, lab: str) -> FreezePaths:
        return cls(LabPaths.for_lab(lab).lab_dir)

    @property
    def manifest(self) -> Path:
        return self.lab_dir / "freeze.json"

    @property
    def disk_inventory(self) -> Path:
        return self.lab_dir / "disk-inventory.json"

    @property
    def saved_state(self) -> Path:
        return self.lab_dir / "snapshot.json"

    @property
    def verify_dir(self) -> Path:
        return self.lab_dir / "verify"
