"""How far the image a task's ``FROM`` names is from the one the lab builds it on.

The name is read as Docker's official images spell them (``ubuntu:24.04``, ``debian:13.0-slim``,
``python:3.11-slim``, ``python:3.13-slim-bookworm``): a distribution, its version, and for
``python`` the Python version. A lock maps a name to one of three: a registry image pinned by
digest (the published image itself); ``"build"``, an image the project builds from Debian packages
the way the name says (``BaseRecipe``: the named Debian release, or the nearest one whose python3
is the named Python); or the lab's local substitute, the guest's own Debian userland (its suite's
Python, its package database, its tools), for a name no recipe reads (the demo's ``bench-base``).
Each task's ``tasks.json`` entry and report row carry the difference.
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
# The lock's value for a FROM name whose image the project builds (BaseRecipe).
BUILD = "build"
# Every built image has python3: the verifiers' uvx needs an interpreter, and uv's own Python
# downloads (what a stock image without Python gets at verify time) are not reachable here.
_VERIFIER_PYTHON: tuple[str, ...] = ("python3",)
# What Docker's python:*-slim images hold beyond Debian's minbase: pip, venv, `python`, the CA
# store (and with it /usr/lib/ssl's openssl.cnf), netbase and tzdata.
_PYTHON_IMAGE: tuple[str, ...] = (
    "python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates", "netbase",
    "tzdata",
)  # fmt: skip


class BaseImageUse(FrozenModel):
    """One ``FROM`` name of a task's Dockerfile and the image the lab gives it."""

    from_name: str
    image: str = Field(description="the lab's image tagged with the FROM name")
    kind: Literal["local substitute", "registry image pinned by digest", "built from Debian"]
    named: str = Field(description="what the name says: distribution, version, Python")
    used: str = Field(description="what the lab's image is")
    differs: tuple[str, ...] = Field(description="each way the two differ; empty: none known")


class BaseRecipe(FrozenModel):
    """A base image the project builds with mmdebstrap (images.base) from pinned Debian packages:
    minbase of ``suite`` plus ``packages``; ``python``: Docker's python image, so no
    EXTERNALLY-MANAGED marker (pip installs into the system as in the real image)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    suite: str
    packages: tuple[str, ...]
    python: bool

    @property
    def image(self) -> str:
        """The guest's name for the built image (every FROM name read as this recipe is also
        tagged to it)."""
        return f"localhost/bench-base/{self.id}:built"


def base_recipe(from_name: str) -> BaseRecipe | None:
    """The image the project builds for ``from_name``, or None when no recipe reads the name.

    ``debian:<12|13|bookworm|trixie>[-slim]`` is that release; ``ubuntu:*`` has no Debian
    release of its own and is the newest one (trixie); ``python:<X.Y>[-slim][-<codename>]`` is
    the named release when its python3 is X.Y, else the release whose python3 is X.Y, else the
    newest."""
    distribution, version, python = _named(from_name)
    newest = list(DEBIAN_RELEASES)[-1]
    if python:
        named = next((suite for suite in DEBIAN_RELEASES if suite in version), "")
        suites = [s for s in (named, *DEBIAN_PYTHON) if s and DEBIAN_PYTHON[s] == python]
        suite = suites[0] if suites else newest
        packages = _PYTHON_IMAGE
        recipe_id = f"python-{DEBIAN_PYTHON[suite]}-{suite}"
    elif distribution == "Ubuntu" or (distribution == "Debian" and "(" in version):
        suite = newest if distribution == "Ubuntu" else version.split("(")[1].rstrip(")")
        packages, recipe_id = _VERIFIER_PYTHON, f"debian-{suite}"
    else:
        return None
    return BaseRecipe(id=recipe_id, suite=suite, packages=packages, python=bool(python))


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


def built_image_use(from_name: str, recipe: BaseRecipe) -> BaseImageUse:
    """``from_name`` given the image ``recipe`` builds from Debian's packages."""
    distribution, version, python = _named(from_name)
    used_version = f"{DEBIAN_RELEASES[recipe.suite]} ({recipe.suite})"
    used_python = DEBIAN_PYTHON[recipe.suite]
    differs = []
    if distribution != "Debian":
        differs.append(f"distribution: {distribution} named, Debian used (the nearest release)")
    elif recipe.suite not in version and version != _UNSTATED:
        differs.append(f"Debian release: {version} named, {used_version} used")
    if python and python != used_python:
        differs.append(f"Python: {python} named, {used_python} used")
    if python:
        differs.append(
            f"Debian's python3 {used_python} in /usr/bin (with pip, venv and `python`), not a "
            "source build in /usr/local"
        )
    else:
        differs.append(
            f"python3 {used_python} added: the verifier's uvx needs an interpreter, and uv's "
            "Python downloads are not reachable here"
        )
    differs.append("apt, pip and uv index the lab's mirror (the frozen set) only")
    return BaseImageUse(
        from_name=from_name,
        image=recipe.image,
        kind="built from Debian",
        named=_describe(distribution, version, python),
        used=f"Python {used_python} on Debian {used_version}, minbase + "
        + ", ".join(recipe.packages),
        differs=tuple(differs),
    )
