"""Facts about the hypervisor host itself (shell commands, as pyinfra's own facts are)."""

from __future__ import annotations

from typing import Literal, TypedDict

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase

BINFMT_DIR = "/proc/sys/fs/binfmt_misc"


class DaemonPids(FactBase[list[int]]):
    """PIDs of running processes named exactly ``process`` (empty when none runs)."""

    def command(self, process: str) -> StringCommand:
        return StringCommand("pgrep", "-x", QuoteString(process), "|| true")

    @staticmethod
    def default() -> list[int]:
        return []

    def process(self, output: list[str]) -> list[int]:
        return [int(line) for line in output if line.strip().isdigit()]


class BinfmtHandler(FactBase[Literal["absent", "enabled", "disabled"]]):
    """Whether binfmt_misc ``handler`` (e.g. qemu-aarch64) is registered and enabled."""

    def command(self, handler: str) -> StringCommand:
        path = QuoteString(f"{BINFMT_DIR}/{handler}")
        return StringCommand("head", "-n1", path, "2>/dev/null || true")

    @staticmethod
    def default() -> Literal["absent", "enabled", "disabled"]:
        return "absent"

    def process(self, output: list[str]) -> Literal["absent", "enabled", "disabled"]:
        first = output[0].strip() if output else ""
        if first == "enabled":
            return "enabled"
        return "disabled" if first == "disabled" else "absent"


class DeviceAccessInfo(TypedDict):
    group: str
    mode: str


class DeviceAccess(FactBase[DeviceAccessInfo]):
    """Group and octal mode of a device node (group "" when the node does not exist)."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("stat", "-c", "'%G %a'", QuoteString(path), "2>/dev/null || true")

    @staticmethod
    def default() -> DeviceAccessInfo:
        return {"group": "", "mode": ""}

    def process(self, output: list[str]) -> DeviceAccessInfo:
        group, _, mode = output[0].strip().partition(" ")
        return {"group": group, "mode": mode}
