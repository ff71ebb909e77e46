"""Debian packages the guest deploy needs beyond the base image, for the guest's suite and arch.

apt does the resolving, with its own state directory configured for the guest (suite, mirror,
architecture; signatures checked with the host's Debian keyring), never the host's. The image is
what mmdebstrap's minbase variant gives (Essential and Priority: required packages, apt) plus the
lock's ``guest.packages``; apt simulates installing that, then that plus the deploy's packages,
and the difference is what the host must carry in. Each package's sha256 comes from the signed
Packages index and is checked when it is downloaded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from debian.deb822 import Packages

from runner.artifacts.fetch import Wanted
from runner.artifacts.plan import Plan, Planned
from runner.artifacts.tools import run_tool
from runner.cache.paths import CachePaths
from runner.spec.lock import Guest
from runner.spec.platform import GuestPlatform

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


@dataclass(frozen=True)
class AptState:
    """apt configured for the guest, in a directory of its own."""

    root: Path
    guest: Guest
    deb_arch: str

    @property
    def config(self) -> Path:
        return self.root / "apt.conf"

    def write(self) -> None:
        for directory in ("etc/apt.conf.d", "etc/preferences.d", "etc/sources.list.d",
                          "lists/partial", "cache/archives/partial"):  # fmt: skip
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        (self.root / "etc/sources.list").write_text(
            f"deb [arch={self.deb_arch} signed-by={_KEYRING}] "
            f"{self.guest.mirror} {self.guest.suite} main\n"
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


async def plan_debs(guest: Guest, platform: GuestPlatform, paths: CachePaths) -> DebianPlan:
    state = AptState(paths.apt_state(guest.suite, platform.deb_arch), guest, platform.deb_arch)
    state.write()
    await state.update()
    image_packages = (*_MINBASE, *guest.packages)
    # One after the other: both runs would rebuild apt's package cache in the same directory.
    image = await state.install_set(image_packages)
    with_deploy = await state.install_set((*image_packages, *GUEST_DEPLOY_DEBS))
    extra = {name: version for name, version in with_deploy.items() if name not in image}
    plan = Plan()
    for stanza in await state.stanzas(extra) if extra else []:
        filename = stanza["Filename"]
        plan.planned.append(
            Planned(
                kind="deb",
                name=stanza["Package"],
                version=stanza["Version"],
                wanted=Wanted(
                    url=f"{guest.mirror.rstrip('/')}/{filename}",
                    filename=filename.rsplit("/", 1)[-1],
                    sha256="sha256:" + stanza["SHA256"],
                ),
            )
        )
    return DebianPlan(plan, _glibc_minor(with_deploy["libc6"]))


def _glibc_minor(libc6_version: str) -> int:
    match = re.match(r"^(?:\d+:)?2\.(\d+)", libc6_version)
    if match is None:
        raise ValueError(f"libc6 {libc6_version}: not a glibc 2.x version")
    return int(match[1])
