"""Facts about the lab guest that pyinfra's own facts do not cover: one command, one shape each."""

from __future__ import annotations

import shlex

from pyinfra.api.facts import FactBase

from runner.lab.layout import GUEST


class UnitStamp(FactBase[str]):
    """The digest a provisioning unit recorded when it finished installing; "" when it never
    did, or when the path it installed is gone since."""

    def command(self, unit: str, installed: str) -> str:
        stamp = shlex.quote(str(GUEST.unit_stamp(unit)))
        return f"if test -e {shlex.quote(installed)}; then cat {stamp} 2>/dev/null; fi; true"

    def process(self, output: list[str]) -> str:
        return "".join(output).strip()

    @staticmethod
    def default() -> str:
        return ""


class ImageLabel(FactBase[str]):
    """A label of a local Podman image; "" when the image or the label is absent."""

    def command(self, image: str, label: str) -> str:
        template = shlex.quote(f'{{{{index .Labels "{label}"}}}}')
        return f"podman image inspect --format {template} {shlex.quote(image)} 2>/dev/null; true"

    def process(self, output: list[str]) -> str:
        value = "".join(output).strip()
        return "" if value == "<no value>" else value

    @staticmethod
    def default() -> str:
        return ""


class ImageDigest(FactBase[str]):
    """The manifest digest of a local Podman image; "" when the image is absent (or has none)."""

    def command(self, image: str) -> str:
        template = shlex.quote("{{.Digest}}")
        return f"podman image inspect --format {template} {shlex.quote(image)} 2>/dev/null; true"

    def process(self, output: list[str]) -> str:
        return "".join(output).strip()

    @staticmethod
    def default() -> str:
        return ""
