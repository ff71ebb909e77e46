"""The guest's platform in each source's own words, and npm's platform-package naming.

A package with native code usually ships one optional package per platform
(``@oh-my-pi/pi-natives-linux-arm64``, ``@oven/bun-linux-aarch64``, ``lightningcss-linux-x64-gnu``)
and npm silently skips an optional package it cannot find. The names are read here so the
resolver can insist that the one for the guest is really there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

GuestArch = Literal["aarch64", "x86_64"]

_DEB_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}
_NPM_CPU = {"aarch64": "arm64", "x86_64": "x64"}
# The Bun build the guest runs. Bun names its builds after uname -m on ARM ("aarch64") but npm's
# "x64" on Intel; the default x64 build needs AVX2, which no CPU model QEMU 7.2 offers under TCG
# has (libvirt's domcapabilities stop at Westmere), so an x86_64 guest runs the baseline build.
_BUN_PACKAGE = {"aarch64": "@oven/bun-linux-aarch64", "x86_64": "@oven/bun-linux-x64-baseline"}
# Oldest manylinux glibc each architecture has wheels for (PEP 600: manylinux_2_17 = 2014).
_OLDEST_MANYLINUX_GLIBC = {"aarch64": 17, "x86_64": 5}

# Words of a package name that name an operating system, a CPU or a C library, mapped to npm's
# values for ``process.platform``, ``process.arch`` and ``libc``.
_OS_WORDS = {
    "linux": "linux", "linuxmusl": "linux", "darwin": "darwin", "macos": "darwin",
    "win32": "win32", "win": "win32", "windows": "win32", "freebsd": "freebsd",
    "openbsd": "openbsd", "netbsd": "netbsd", "android": "android", "sunos": "sunos",
    "aix": "aix",
}  # fmt: skip
_CPU_WORDS = {
    "x64": "x64", "amd64": "x64", "x86_64": "x64", "arm64": "arm64", "aarch64": "arm64",
    "arm": "arm", "armhf": "arm", "armv7": "arm", "ia32": "ia32", "x86": "ia32",
    "i386": "ia32", "ppc64": "ppc64", "ppc64le": "ppc64", "s390x": "s390x",
    "riscv64": "riscv64", "loong64": "loong64", "mips64el": "mips64el",
}  # fmt: skip
_NOT_GLIBC_WORDS = {"musl", "linuxmusl", "android"}


@dataclass(frozen=True)
class PlatformName:
    """The platform a package's name says it is for."""

    os: str
    cpu: str
    glibc: bool


def platform_of(package_name: str) -> PlatformName | None:
    """``pi-natives-linux-arm64`` -> linux/arm64; None for a name that names no platform."""
    words = re.split(r"[-.]", package_name.rsplit("/", 1)[-1].lower())
    os_name = next((_OS_WORDS[word] for word in words if word in _OS_WORDS), None)
    cpu = next((_CPU_WORDS[word] for word in words if word in _CPU_WORDS), None)
    if os_name is None or cpu is None:
        return None
    return PlatformName(os_name, cpu, glibc=not _NOT_GLIBC_WORDS.intersection(words))


@dataclass(frozen=True)
class GuestPlatform:
    """The guest: Debian on Linux with glibc, on the lock's CPU architecture."""

    arch: GuestArch

    @property
    def deb_arch(self) -> str:
        return _DEB_ARCH[self.arch]

    @property
    def npm_os(self) -> str:
        return "linux"

    @property
    def npm_cpu(self) -> str:
        return _NPM_CPU[self.arch]

    @property
    def npm_libc(self) -> str:
        return "glibc"

    @property
    def node_package(self) -> str:
        return f"node-linux-{self.npm_cpu}"

    @property
    def bun_package(self) -> str:
        return _BUN_PACKAGE[self.arch]

    def wheel_platforms(self, glibc_minor: int) -> list[str]:
        """pip's ``--platform`` tags for this glibc (pip does not widen a tag by itself)."""
        oldest = _OLDEST_MANYLINUX_GLIBC[self.arch]
        return [f"manylinux_2_{minor}_{self.arch}" for minor in range(glibc_minor, oldest - 1, -1)]

    def named_in(self, package_name: str) -> bool:
        """True when a package's name says it is built for this guest."""
        named = platform_of(package_name)
        return (
            named is not None
            and named.os == self.npm_os
            and named.cpu == self.npm_cpu
            and named.glibc
        )

    def accepts(
        self, os_list: Sequence[str], cpu_list: Sequence[str], libc_list: Sequence[str]
    ) -> bool:
        """npm's own rule for a package's ``os``/``cpu``/``libc`` fields (``!`` excludes)."""
        return all(
            _allowed(values, ours)
            for values, ours in (
                (os_list, self.npm_os),
                (cpu_list, self.npm_cpu),
                (libc_list, self.npm_libc),
            )
        )


def _allowed(values: Sequence[str], ours: str) -> bool:
    if not values:
        return True
    if f"!{ours}" in values:
        return False
    positive = [value for value in values if not value.startswith("!")]
    return not positive or ours in positive
