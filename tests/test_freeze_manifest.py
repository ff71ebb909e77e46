"""The freeze manifest: canonical listings, tree and task digests, strict loading, the scope."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from runner.freeze.manifest import FreezeManifest, Tree, default_scope, listing_text
from tests.support.freeze_factory import manifest_of

SHA_A = "sha256:" + "a" * 64
SHA_B = "sha256:" + "b" * 64
COLLECTED = {
    "kernel": "6.12",
    "packages": {"bash": "5.2"},
    "files": {"/usr/local/bin/pi": "symlink:x"},
    "trees": {
        "/srv/tasks": {"t1/task.toml": SHA_A, "t1/tests/test.sh": SHA_B, "t2/task.toml": SHA_B}
    },
    "venvs": {},
    "images": [],
    "listening": [{"proto": "tcp", "port": 22}],
}
SCOPE = {"files": ["/usr/local/bin/*"], "trees": ["/srv/tasks"], "task_roots": ["/srv/tasks"]}


def test_listing_is_bytewise_sorted_tab_separated_lines() -> None:
    files = {"b": SHA_A, "a b": SHA_B, "B": "symlink:b", "\u00e9": SHA_A}
    assert listing_text(files) == (f"B\tsymlink:b\na b\t{SHA_B}\nb\t{SHA_A}\n\u00e9\t{SHA_A}\n")


def test_tree_digest_is_the_sha256_of_its_listing() -> None:
    tree = Tree.of({"x": SHA_A})
    assert tree.listing_sha256 == "sha256:" + hashlib.sha256(f"x\t{SHA_A}\n".encode()).hexdigest()
    assert Tree.of({}).listing_sha256.endswith(hashlib.sha256(b"").hexdigest())


def test_a_tree_whose_digest_does_not_match_its_files_is_rejected() -> None:
    with pytest.raises(ValidationError, match="listing_sha256 does not match"):
        Tree(listing_sha256=SHA_A, files={"x": SHA_B})


def test_each_task_has_the_digest_of_its_own_files() -> None:
    manifest = manifest_of(SCOPE, COLLECTED)
    assert manifest.state.tasks == {
        "/srv/tasks/t1": Tree.of({"task.toml": SHA_A, "tests/test.sh": SHA_B}).listing_sha256,
        "/srv/tasks/t2": Tree.of({"task.toml": SHA_B}).listing_sha256,
    }


def test_manifest_round_trips_and_its_digest_is_stable() -> None:
    manifest = manifest_of(SCOPE, COLLECTED)
    again = FreezeManifest.model_validate_json(manifest.model_dump_json())
    assert again == manifest and again.sha256 == manifest.sha256
    changed = manifest_of(SCOPE, {**COLLECTED, "kernel": "6.13"})
    assert changed.sha256 != manifest.sha256


def test_unknown_fields_and_bad_entries_are_rejected() -> None:
    data = manifest_of(SCOPE, COLLECTED).model_dump(mode="json")
    with pytest.raises(ValidationError, match="Extra inputs"):
        FreezeManifest.model_validate({**data, "note": "x"})
    data["state"]["files"] = {"/usr/local/bin/pi": "md5:1234"}
    with pytest.raises(ValidationError):
        FreezeManifest.model_validate(data)


def test_the_shipped_scope_loads_and_freezes_the_harness_paths() -> None:
    scope = default_scope()
    assert "/usr/local/bin/*" in scope.files
    assert {"/opt", "/srv/tasks"} <= set(scope.trees)
    assert set(scope.task_roots) <= set(scope.trees)
    assert "__pycache__" in scope.tree_excludes
