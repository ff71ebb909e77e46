"""Debian packages the guest deploy needs beyond the base image, for the guest's suite and arch.

apt does the resolving, with its own state directory configured for the guest (suite, mirror,
architecture; signatures checked with the host's Debian keyring), never the host's. The image is
what mmdebstrap's minbase variant gives (Essential and Priority: required packages, apt) plus the
lock's ``guest.packages``; apt simulates installing that, then that plus the deploy's packages,
and the difference is what the host must carry in. Each package's sha256 comes from the signed
Packages index and is checked when it is downloaded.

``tools.podman`` is that exact upstream version, from the guest's suite or one of its
``tool_suites`` (sources at a low pin priority: apt takes nothing from them unasked). apt gets
``podman=<Debian version>``; a dependency the guest's suite cannot satisfy is asked for from the
suite of the package that needs it, until apt's simulation succeeds. Each deb records its suite.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from debian.deb822 import Packages

from runner.artifacts.fetch import Wanted
from runner.artifacts.plan import Plan, Planned
from runner.artifacts.tools import run_tool, run_tool_unchecked
from runner.cache.paths import CachePaths
from runner.core.errors import RunnerError
from runner.core.models import updated
from runner.spec.base_images import BaseRecipe
from runner.spec.lock import Guest, Tools
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import ArtifactKind

# What the guest deploy installs with dpkg on top of the image (FIELD-NOTES, "Harbor in the arm64
# guest"): Harbor drives `docker compose` through Podman, creates a venv with pip, and netavark
# needs `nft` to start a container. Whatever the image already has is left out again below.
GUEST_DEPLOY_DEBS = (
    "podman-docker", "docker-compose", "python3-venv", "python3.13-venv", "python3-pip-whl",
    "python3-setuptools-whl", "nftables", "libnftables1", "libnftnl11", "libjansson4",
    "libxtables12", "libedit2",
)  # fmt: skip
# mmdebstrap --variant=minbase: the Essential set, Priority: required, and apt.
_MINBASE = ("?or(?essential,?priority(required))", "apt")
_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_INST = re.compile(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", re.MULTILINE)
# apt-cache madison: "podman | 6.1.1+ds1-1+b1 | http://deb.debian.org/debian experimental/main ..."
_MADISON = re.compile(r"^\s*(\S+)\s+\|\s+(\S+)\s+\|\s+\S+\s+([^/\s]+)/", re.MULTILINE)
# apt's "unmet dependencies": " libsubid6 : Depends: libc6 (>= 2.43) but 2.41-12 is to be ..."
_UNMET = re.compile(r"^ +(\S+) : (?:Pre)?Depends: (\S+) \(", re.MULTILINE)
# The Debian packages of the pinned tools, by the lock's [tools] field.
PINNED_TOOL_DEBS = {"podman": "podman"}
# Rounds of "take this dependency from that suite" before the pin is given up as unsatisfiable.
_MAX_FIXUPS = 12


@dataclass(frozen=True)
class AptState:
    """apt configured for the guest, in a directory of its own."""

    root: Path
    guest: Guest
    deb_arch: str

    @property
    def config(self) -> Path:
        return self.root / "apt.conf"

    @property
    def suites(self) -> tuple[str, ...]:
        return (self.guest.suite, *self.guest.tool_suites)

    def write(self) -> None:
        for directory in ("etc/apt.conf.d", "etc/preferences.d", "etc/sources.list.d",
                          "lists/partial", "cache/archives/partial"):  # fmt: skip
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        (self.root / "etc/sources.list").write_text("".join(map(self._source, self.suites)))
        # Below the guest suite's 500 (and experimental's NotAutomatic 1 lifted to the same):
        # a tool suite gives only what is asked for by name or nothing else provides.
        (self.root / "etc/preferences").write_text(
            "".join(
                f"Package: *\nPin: release n={suite}\nPin-Priority: 100\n\n"
                for suite in self.guest.tool_suites
            )
        )
        settings = {
            "Dir::State": self.root,
            "Dir::State::Lists": self.root / "lists",
            "Dir::State::status": self.root / "status",
            "Dir::Cache": self.root / "cache",
            "Dir::Etc": self.root / "etc",
            "Dir::Etc::Parts": self.root / "etc/apt.conf.d",
            "Dir::Etc::SourceList": self.root / "etc/sources.list",
            "Dir::Etc::SourceParts": self.root / "etc/sources.list.d",
            "Dir::Etc::Preferences": self.root / "etc/preferences",
            "Dir::Etc::PreferencesParts": self.root / "etc/preferences.d",
            "APT::Architecture": self.deb_arch,
            "APT::Architectures": self.deb_arch,
            "APT::Install-Recommends": "false",
            "Acquire::Languages": "none",
        }
        self.config.write_text("".join(f'{key} "{value}";\n' for key, value in settings.items()))

    def _source(self, suite: str) -> str:
        # sid's and experimental's Release files carry a Valid-Until that a frozen mirror
        # outlives; their signatures are still checked, and each deb's sha256 is recorded.
        expiry = "" if suite == self.guest.suite else " check-valid-until=no"
        return (
            f"deb [arch={self.deb_arch} signed-by={_KEYRING}{expiry}] "
            f"{self.guest.mirror} {suite} main\n"
        )

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "APT_CONFIG": str(self.config)}

    async def update(self) -> None:
        await run_tool(["apt-get", "update", "-q"], f"apt-get update ({self.guest.suite}/"
                       f"{self.deb_arch})", env=self.env)  # fmt: skip

    async def install_set(self, packages: tuple[str, ...]) -> dict[str, str]:
        """Package -> version of everything apt would install on an empty system."""
        output = await run_tool(
            ["apt-get", "install", "--simulate", "-q", *packages],
            f"apt in {self.guest.suite}/{self.deb_arch}",
            env=self.env,
        )
        return dict(_INST.findall(output))

    async def attempt(
        self, packages: tuple[str, ...]
    ) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """apt's simulation, or the (package, dependency) pairs it could not satisfy."""
        output, ok = await run_tool_unchecked(
            ["apt-get", "install", "--simulate", "-q", *packages], env=self.env
        )
        if ok:
            return dict(_INST.findall(output)), []
        unmet = _UNMET.findall(output)
        if not unmet:
            raise RunnerError(f"apt in {'+'.join(self.suites)}/{self.deb_arch}: {output[-400:]}")
        return {}, unmet

    async def suites_of(self, names: list[str]) -> dict[tuple[str, str], str]:
        """(package, version) -> the first of our suites that has it."""
        output = await run_tool(["apt-cache", "madison", *names], "apt-cache madison", env=self.env)
        found: dict[tuple[str, str], str] = {}
        for name, version, suite in sorted(
            _MADISON.findall(output), key=lambda row: self.suites.index(row[2])
        ):
            found.setdefault((name, version), suite)
        return found

    async def stanzas(self, versions: dict[str, str]) -> list[Packages]:
        pins = [f"{name}={version}" for name, version in sorted(versions.items())]
        output = await run_tool(
            ["apt-cache", "show", "--no-all-versions", *pins], "apt-cache show", env=self.env
        )
        return list(Packages.iter_paragraphs(output, use_apt_pkg=False))


@dataclass(frozen=True)
class DebianPlan:
    plan: Plan
    glibc_minor: int  # of the suite's libc6: which manylinux wheels run on the guest


async def plan_debs(
    guest: Guest,
    tools: Tools,
    platform: GuestPlatform,
    paths: CachePaths,
    task_debs: tuple[str, ...] = (),
) -> DebianPlan:
    """The packages the deploy installs on the image's (``guest.packages``), and ``task_debs``
    (what the tasks' verifiers would install): each with its dependencies, pinned."""
    suites = "+".join((guest.suite, *guest.tool_suites))
    state = AptState(paths.apt_state(suites, platform.deb_arch), guest, platform.deb_arch)
    state.write()
    await state.update()
    image_packages = (*_MINBASE, *guest.packages)
    plan = Plan()
    pins = await _tool_pins(state, tools, plan)
    if plan.unavailable:
        return DebianPlan(plan, 0)
    # One after the other: both runs would rebuild apt's package cache in the same directory.
    image = await state.install_set(image_packages)
    with_deploy = await _install_with_pins(
        state, (*image_packages, *GUEST_DEPLOY_DEBS, *task_debs), pins
    )
    extra = {name: version for name, version in with_deploy.items() if image.get(name) != version}
    suites_of = await state.suites_of(sorted(extra)) if extra else {}
    for stanza in await state.stanzas(extra) if extra else []:
        suite = suites_of[(stanza["Package"], stanza["Version"])]
        plan.planned.append(_planned(stanza, "deb", guest.mirror, suite))
    return DebianPlan(plan, _glibc_minor(with_deploy["libc6"]))


async def plan_base_image_debs(
    recipes: tuple[BaseRecipe, ...],
    guest: Guest,
    platform: GuestPlatform,
    paths: CachePaths,
    task_debs: tuple[str, ...] = (),
) -> Plan:
    """Every package of each built base image (minbase of its suite plus its packages), pinned:
    images.base builds the image from exactly these files. With them, what ``task_debs`` (the
    verifiers' apt-get) needs on that image, which the lab's mirror serves. One recipe after the
    other: two of one suite share apt's state directory."""
    plan = Plan()
    for recipe in recipes:
        suite_guest = updated(guest, suite=recipe.suite, tool_suites=())
        state = AptState(paths.apt_state(recipe.suite, platform.deb_arch), suite_guest,
                         platform.deb_arch)  # fmt: skip
        state.write()
        await state.update()
        # eatmydata: what mmdebstrap's eatmydata hook installs while it builds, then removes.
        wanted = (*_MINBASE, *recipe.packages, "eatmydata", *task_debs)
        versions = await state.install_set(wanted)
        for stanza in await state.stanzas(versions):
            plan.planned.append(
                _planned(stanza, "base-deb", guest.mirror, recipe.suite, (recipe.id,))
            )
    return plan


def _planned(
    stanza: Packages, kind: ArtifactKind, mirror: str, suite: str, images: tuple[str, ...] = ()
) -> Planned:
    filename = stanza["Filename"]
    return Planned(
        kind=kind,
        name=stanza["Package"],
        version=stanza["Version"],
        wanted=Wanted(
            url=f"{mirror.rstrip('/')}/{filename}",
            filename=filename.rsplit("/", 1)[-1],
            sha256="sha256:" + stanza["SHA256"],
        ),
        suite=suite,
        images=images,
    )


async def _tool_pins(state: AptState, tools: Tools, plan: Plan) -> dict[str, str]:
    """Debian package -> ``package=<Debian version>`` for each pinned tool, from the first suite
    that has its upstream version; a version no suite has is a line in ``plan.unavailable``."""
    pins: dict[str, str] = {}
    for field, package in PINNED_TOOL_DEBS.items():
        wanted = getattr(tools, field)
        found = await state.suites_of([package])
        matching = [version for (_, version) in found if upstream_version(version) == wanted]
        if matching:
            pins[package] = f"{package}={matching[0]}"
            continue
        by_suite = {suite: upstream_version(version) for (_, version), suite in found.items()}
        listed = ", ".join(
            f"{suite} {by_suite[suite]}" for suite in state.suites if suite in by_suite
        )
        plan.unavailable.append(
            f"deb:{package}@{wanted} (tools.{field}): in none of the suites "
            f"{'+'.join(state.suites)} of {state.guest.mirror}; they have: {listed or 'none'}"
        )
    return pins


async def _install_with_pins(
    state: AptState, packages: tuple[str, ...], pins: dict[str, str]
) -> dict[str, str]:
    """apt's install set with the pinned versions; a dependency apt cannot satisfy from the
    guest suite is asked for from the suite of the package that needs it (``libc6/sid`` for
    sid's libsubid6), and a package that needs the newer dependency the same way."""
    taken: dict[str, str] = {name: "" for name in pins}
    for _ in range(_MAX_FIXUPS):
        asked = (*packages, *pins.values(), *(f"{n}/{s}" for n, s in taken.items() if s))
        installed, unmet = await state.attempt(asked)
        if not unmet:
            return installed
        package, dependency = unmet[0]
        suite = await _suite_to_take(state, package, dependency, taken)
        if suite is None:
            break
        taken[dependency if dependency not in taken else package] = suite
    raise RunnerError(
        f"apt in {'+'.join(state.suites)}/{state.deb_arch}: cannot install "
        f"{', '.join(pins.values())} (unmet: {' '.join(map('/'.join, unmet))})"
    )


async def _suite_to_take(
    state: AptState, package: str, dependency: str, taken: dict[str, str]
) -> str | None:
    if dependency in taken and package in taken:
        return None
    if dependency in taken:  # the package must follow the dependency it needs to its suite
        return taken[dependency] or None
    # The dependency from the newest suite the package itself comes from (or the first tool
    # suite that has it): packages of one suite are built against each other.
    found = await state.suites_of([package, dependency])
    package_suites = [suite for (name, _), suite in found.items() if name == package]
    dependency_suites = {suite for (name, _), suite in found.items() if name == dependency}
    for suite in (*package_suites, *state.guest.tool_suites):
        if suite != state.guest.suite and suite in dependency_suites:
            return suite
    return None


def upstream_version(debian_version: str) -> str:
    """``1:6.1.1+ds1-1+b1`` -> ``6.1.1``: no epoch, no Debian revision, no repack suffix."""
    without_epoch = debian_version.split(":", 1)[-1]
    return re.split(r"[+~]", without_epoch.rsplit("-", 1)[0], maxsplit=1)[0]


def _glibc_minor(libc6_version: str) -> int:
    match = re.match(r"^(?:\d+:)?2\.(\d+)", libc6_version)
    if match is None:
        raise ValueError(f"libc6 {libc6_version}: not a glibc 2.x version")
    return int(match[1])
