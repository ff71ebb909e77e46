"""How far the image a task's ``FROM`` names is from the one the lab builds it on.

The name is read as Docker's official images spell them (``ubuntu:24.04``, ``debian:13.0-slim``,
``python:3.11-slim``, ``python:3.13-slim-bookworm``): a distribution, its version, and for
``python`` the Python version. The lab's local substitute is the guest's own Debian userland
(its suite's Python, its package database, its tools); a registry image pinned by digest is the
published image itself. Each task's ``tasks.json`` entry and report row carry the difference.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from runner.core.models import FrozenModel

# Debian's release numbers and each suite's python3, as its archive has them.
DEBIAN_RELEASES = {"bullseye": "11", "bookworm": "12", "trixie": "13"}
DEBIAN_PYTHON = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
_TAG = re.compile(r"^(?:(?P<registry>[^/]+\.[^/]+|localhost)/)?(?:library/)?(?P<repo>[^:@]+)"
                  r"(?::(?P<tag>[^@]+))?")  # fmt: skip
_UNSTATED = "(release not in the tag)"
_PYTHON_TAG = re.compile(r"^(?P<python>\d+\.\d+)(?:\.\d+)?(?:-(?P<rest>.+))?$")


class BaseImageUse(FrozenModel):
    """One ``FROM`` name of a task's Dockerfile and the image the lab gives it."""

    from_name: str
    image: str = Field(description="the lab's image tagged with the FROM name")
    kind: Literal["local substitute", "registry image pinned by digest"]
    named: str = Field(description="what the name says: distribution, version, Python")
    used: str = Field(description="what the lab's image is")
    differs: tuple[str, ...] = Field(description="each way the two differ; empty: none known")


def _debian(tag: str) -> tuple[str, str]:
    """Debian's version and codename in a tag (``13.0-slim``, ``bookworm-slim``), as far as
    the tag says them."""
    for codename, number in DEBIAN_RELEASES.items():
        if codename in tag or tag.split(".")[0].split("-")[0] == number:
            version = tag.split("-")[0] if tag[:1].isdigit() else number
            return version, codename
    return tag, ""


def _named(from_name: str) -> tuple[str, str, str]:
    """(distribution, version, python) the name says; '' where it says nothing."""
    found = _TAG.match(from_name)
    repo, tag = (found["repo"], found["tag"] or "latest") if found else (from_name, "latest")
    if repo == "ubuntu":
        return "Ubuntu", tag, ""
    if repo == "debian":
        version, codename = _debian(tag)
        return "Debian", f"{version} ({codename})" if codename else version, ""
    python = _PYTHON_TAG.match(tag) if repo == "python" else None
    if python is not None:
        rest = python["rest"] or ""
        codename = next((name for name in DEBIAN_RELEASES if name in rest), "")
        version = f"{DEBIAN_RELEASES[codename]} ({codename})" if codename else _UNSTATED
        return "Debian", version, python["python"]
    return "", "", ""


def _describe(distribution: str, version: str, python: str) -> str:
    if not distribution:
        return "not known from its name"
    base = f"{distribution} {version}"
    return f"Python {python} on {base}" if python else base


def local_substitute_use(from_name: str, image: str, suite: str) -> BaseImageUse:
    """``from_name`` built on the lab's local substitute: the guest's Debian ``suite``."""
    distribution, version, python = _named(from_name)
    used_version = f"{DEBIAN_RELEASES.get(suite, '?')} ({suite})"
    used_python = DEBIAN_PYTHON.get(suite, "?")
    differs = []
    if not distribution:
        differs.append("the named image's distribution is not known from its name")
    elif distribution != "Debian":
        differs.append(f"distribution: {distribution} named, Debian used")
    elif suite not in version and version != _UNSTATED:
        differs.append(f"Debian release: {version} named, {used_version} used")
    if python and python != used_python:
        differs.append(f"Python: {python} named, {used_python} used")
    differs.append("the guest's own userland: its package database, tools and Python packaging")
    return BaseImageUse(
        from_name=from_name,
        image=image,
        kind="local substitute",
        named=_describe(distribution, version, python),
        used=f"Python {used_python} on Debian {used_version}, the guest's own userland",
        differs=tuple(differs),
    )


def registry_image_use(from_name: str, image: str) -> BaseImageUse:
    """``from_name`` given a registry image pinned by digest: the published image itself."""
    distribution, version, python = _named(from_name)
    return BaseImageUse(
        from_name=from_name,
        image=image,
        kind="registry image pinned by digest",
        named=_describe(distribution, version, python),
        used="the registry image itself, pinned by digest",
        differs=(),
    )
