"""Pinned tools across suites: lock fields that leave old locks' digests alone, and
``tools.podman`` resolved from the guest's suite or its ``tool_suites``: against the real Debian
archive (``registry`` tests), and the fail-closed line also from apt's recorded answers.

apt's answers are recorded rather than a Debian mirror served on loopback: the resolver has apt
check each suite's Release against Debian's own keyring, which no stand-in can sign for."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from runner.artifacts import debian
from runner.artifacts.debian import DebianPlan, plan_debs, upstream_version
from runner.cache.paths import CachePaths
from runner.core.errors import InputError
from runner.spec.lock import load_lock
from runner.spec.platform import GuestPlatform
from tests.support.old_locks import (
    SEED_54_BEFORE,
    SEED_54_BEFORE_FINGERPRINT,
)

REPO = Path(__file__).resolve().parent.parent
# What apt answered in seed-54's guest apt state (trixie + sid + experimental, arm64) on
# 2026-12-05 (tests/registry_answers/README.md), by the command asked.
RECORDED_APT: dict[tuple[str, ...], str] = {
    ("apt-get", "update", "-q"): "",
    ("apt-cache", "madison", "podman"): (
        REPO / "tests" / "registry_answers" / "debian" / "apt-cache-madison-podman.txt"
    ).read_text(),
}


def test_new_fields_at_their_defaults_keep_old_digests() -> None:
    before = load_lock(SEED_54_BEFORE)
    assert before.guest.tool_suites == () and before.reference_versions == {}
    assert before.fingerprint == SEED_54_BEFORE_FINGERPRINT


def test_tool_suites_are_environment_inputs_but_reference_versions_are_not() -> None:
    lock = load_lock(REPO / "locks" / "seed-54.toml")
    assert lock.reference_versions == {"podman": "6.0.2"}
    assert lock.guest.tool_suites == ("sid", "experimental")
    no_reference = lock.model_copy(update={"reference_versions": {}})
    assert no_reference.environment_inputs == lock.environment_inputs
    assert no_reference.fingerprint != lock.fingerprint
    no_suites = lock.guest.model_copy(update={"tool_suites": ()})
    assert lock.model_copy(update={"guest": no_suites}).environment_inputs != (
        lock.environment_inputs
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('reference_versions = { docker = "1" }', "'docker' is not a pinned tool"),
        ('[guest]\ntool_suites = ["trixie"]', "'trixie' is the guest's own suite"),
    ],
)
def test_bad_tool_fields_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    source = SEED_54_BEFORE.read_text()
    if text.startswith("[guest]"):
        source = source.replace("[guest]\n", text + "\n")
    else:
        source = text + "\n" + source
    path = tmp_path / "bad.toml"
    path.write_text(source)
    with pytest.raises(InputError, match=message) as raised:
        load_lock(path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("debian", "upstream"),
    [("6.1.1+ds1-1+b1", "6.1.1"), ("1:4.20.3-1", "4.20.3"), ("2.41-12+deb13u5", "2.41"),
     ("5.4.2~rc1-1", "5.4.2"), ("1.0", "1.0")],
)  # fmt: skip
def test_upstream_version(debian: str, upstream: str) -> None:
    assert upstream_version(debian) == upstream


def _plan(podman: str, cache: Path) -> DebianPlan:
    """seed-54's guest (trixie + sid + experimental, arm64), its podman pinned to ``podman``."""
    lock = load_lock(REPO / "locks" / "seed-54.toml")
    tools = lock.tools.model_copy(update={"podman": podman})
    return asyncio.run(plan_debs(lock.guest, tools, GuestPlatform("aarch64"), CachePaths(cache)))


@pytest.fixture(params=[pytest.param("live", marks=pytest.mark.registry), "recorded"])
def apt_answers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """apt asks the real Debian archive, or answers from RECORDED_APT (a command not recorded
    fails the test: the code asked apt something new)."""
    if request.param == "live":
        return

    async def recorded(
        args: Sequence[str], what: str, *, env: Mapping[str, str] | None = None
    ) -> str:
        return RECORDED_APT[tuple(args)]

    monkeypatch.setattr(debian, "run_tool", recorded)


@pytest.mark.registry
def test_podman_from_experimental_brings_what_it_needs_from_sid(tmp_path: Path) -> None:
    plan = _plan("6.1.1", tmp_path)
    assert plan.plan.unavailable == []
    suites = {planned.name: (planned.version, planned.suite) for planned in plan.plan.planned}
    assert suites["podman"] == ("6.1.1+ds1-1+b1", "experimental")
    assert {name for name, (_, suite) in suites.items() if suite == "sid"} == {
        "libc6", "libc-bin", "libc-gconv-modules-extra", "libgpgme45", "libsubid6",
    }  # fmt: skip
    assert suites["docker-compose"][1] == "trixie"
    assert plan.glibc_minor == 43  # sid's libc6: the wheels are chosen for it


@pytest.mark.usefixtures("apt_answers")
def test_podman_no_suite_has_fails_closed_naming_each_suites_version(tmp_path: Path) -> None:
    plan = _plan("6.0.2", tmp_path)
    assert plan.plan.unavailable == [
        "deb:podman@6.0.2 (tools.podman): in none of the suites trixie+sid+experimental of "
        "http://deb.debian.org/debian; they have: trixie 5.4.2, sid 5.8.6, experimental 6.1.1"
    ]
    assert plan.plan.planned == []
