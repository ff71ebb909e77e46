"""The freeze manifest: canonical listings, task digests from the disk inventory, the disk
summary, strict loading, the scope."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from runner.freeze.inventory import Observed, PackageFile, inventory_of
from runner.freeze.manifest import (
    DiskSummary,
    FreezeManifest,
    FreezeScope,
    default_scope,
    listing_digest,
    listing_text,
    task_digests,
)
from tests.support.freeze_factory import manifest_of

SHA_A = "sha256:" + "a" * 64
SHA_B = "sha256:" + "b" * 64
FILE_A = f"file 0644 0:0 {SHA_A}"
FILE_B = f"file 0755 0:0 {SHA_B}"
COLLECTED = {
    "kernel": "6.12",
    "packages": {"bash": "5.2"},
    "images": [],
    "listening": [{"proto": "tcp", "port": 22}],
}
ENTRIES = {
    "/srv": "dir 0755 0:0",
    "/srv/tasks": "dir 0755 0:0",
    "/srv/tasks/t1": "dir 0755 0:0",
    "/srv/tasks/t1/task.toml": FILE_A,
    "/srv/tasks/t1/tests": "dir 0755 0:0",
    "/srv/tasks/t1/tests/test.sh": FILE_B,
    "/srv/tasks/t2": "dir 0755 0:0",
    "/srv/tasks/t2/task.toml": FILE_B,
    "/srv/tasks/t3": "dir 0755 0:0",
    "/srv/other/task.toml": FILE_A,
}
SCOPE = {"task_roots": ["/srv/tasks"]}
LIVE = {"module": {"nf_tables": "loaded"}, "cmdline": {"cmdline": "root=/dev/vda1"}}


def test_listing_is_bytewise_sorted_tab_separated_lines() -> None:
    files = {"b": SHA_A, "a b": SHA_B, "B": "symlink:b", "\u00e9": SHA_A}
    assert listing_text(files) == (f"B\tsymlink:b\na b\t{SHA_B}\nb\t{SHA_A}\n\u00e9\t{SHA_A}\n")


def test_listing_digest_is_the_sha256_of_the_listing() -> None:
    assert listing_digest({"x": FILE_A}) == (
        "sha256:" + hashlib.sha256(f"x\t{FILE_A}\n".encode()).hexdigest()
    )
    assert listing_digest({}) == "sha256:" + hashlib.sha256(b"").hexdigest()


def test_each_task_has_the_digest_of_the_entries_below_it() -> None:
    assert task_digests(ENTRIES, ("/srv/tasks",)) == {
        "/srv/tasks/t1": listing_digest(
            {"task.toml": FILE_A, "tests": "dir 0755 0:0", "tests/test.sh": FILE_B}
        ),
        "/srv/tasks/t2": listing_digest({"task.toml": FILE_B}),
        "/srv/tasks/t3": listing_digest({}),  # an empty task directory is still a task
    }
    # A trailing slash names the same root; no root, no tasks.
    assert task_digests(ENTRIES, ("/srv/tasks/",)) == task_digests(ENTRIES, ("/srv/tasks",))
    assert task_digests(ENTRIES, ()) == {}


def test_a_changed_file_changes_its_tasks_digest_only() -> None:
    changed = {**ENTRIES, "/srv/tasks/t2/task.toml": FILE_A}
    before, after = task_digests(ENTRIES, ("/srv/tasks",)), task_digests(changed, ("/srv/tasks",))
    assert before["/srv/tasks/t1"] == after["/srv/tasks/t1"]
    assert before["/srv/tasks/t2"] != after["/srv/tasks/t2"]


def test_the_manifest_holds_the_tasks_the_live_state_and_the_disk_summary() -> None:
    manifest = manifest_of(SCOPE, COLLECTED, live=LIVE, entries=ENTRIES)
    assert manifest.schema_version == 2
    assert manifest.state.tasks == task_digests(ENTRIES, ("/srv/tasks",))
    assert manifest.state.live == LIVE
    inventory = inventory_of(Observed(entries=ENTRIES), manifest.scope.disk_excludes)
    assert manifest.state.disk.inventory_sha256 == inventory.sha256
    assert (manifest.state.disk.paths, manifest.state.disk.regular_files) == (len(ENTRIES), 4)


def test_the_disk_summary_counts_packages_and_their_deviations() -> None:
    observed = Observed(
        entries={"/usr/bin/a": FILE_A, "/usr/bin/b": FILE_B, "/etc/c": FILE_A, "/usr": "dir"},
        package_md5={"/usr/bin/a": "1" * 32, "/usr/bin/b": "2" * 32, "/etc/c": "9" * 32},
        packages={
            "/usr/bin/a": PackageFile("pa", "1" * 32),
            "/usr/bin/b": PackageFile("pa", "2" * 32),
            "/etc/c": PackageFile("pc", "3" * 32, conffile=True),
        },
    )
    inventory = inventory_of(observed, ())
    assert inventory.deviations == {"/etc/c": f"pc md5 {'3' * 32} {'9' * 32}"}
    summary = DiskSummary.of(inventory, observed)
    assert (summary.paths, summary.regular_files) == (4, 3)
    assert (summary.packages, summary.package_files, summary.package_deviations) == (2, 3, 1)


def test_manifest_round_trips_and_its_digest_is_stable() -> None:
    manifest = manifest_of(SCOPE, COLLECTED, live=LIVE, entries=ENTRIES)
    again = FreezeManifest.model_validate_json(manifest.model_dump_json())
    assert again == manifest and again.sha256 == manifest.sha256
    for changed in (
        manifest_of(SCOPE, {**COLLECTED, "kernel": "6.13"}, live=LIVE, entries=ENTRIES),
        manifest_of(SCOPE, COLLECTED, live={**LIVE, "module": {}}, entries=ENTRIES),
        manifest_of(SCOPE, COLLECTED, live=LIVE, entries={**ENTRIES, "/srv/new": FILE_A}),
    ):
        assert changed.sha256 != manifest.sha256


def test_unknown_fields_old_schemas_and_bad_entries_are_rejected() -> None:
    data = manifest_of(SCOPE, COLLECTED, live=LIVE, entries=ENTRIES).model_dump(mode="json")
    with pytest.raises(ValidationError, match="Extra inputs"):
        FreezeManifest.model_validate({**data, "note": "x"})
    with pytest.raises(ValidationError):  # a lab frozen with schema 1 must be frozen again
        FreezeManifest.model_validate({**data, "schema_version": 1})
    state = data["state"]
    for removed in ("files", "trees", "venvs"):
        with pytest.raises(ValidationError, match="Extra inputs"):
            FreezeManifest.model_validate({**data, "state": {**state, removed: {}}})
    bad_digest = {**state, "disk": {**state["disk"], "inventory_sha256": "md5:1234"}}
    with pytest.raises(ValidationError):
        FreezeManifest.model_validate({**data, "state": bad_digest})


def test_a_scope_must_name_its_disk_excludes_and_nothing_of_schema_1() -> None:
    with pytest.raises(ValidationError, match="disk_excludes"):
        FreezeScope.model_validate({})
    with pytest.raises(ValidationError, match="pattern"):
        FreezeScope.model_validate({"disk_excludes": ["var/log"]})  # not absolute
    with pytest.raises(ValidationError, match="Extra inputs"):
        FreezeScope.model_validate({"disk_excludes": [], "trees": ["/opt"]})


def test_the_shipped_scope_loads_and_covers_the_harness_paths() -> None:
    scope = default_scope()
    assert "/var/log" in scope.disk_excludes
    assert scope.task_roots == ("/srv/tasks",)
    covered = ("/etc", "/root", "/home", "/usr", "/opt", "/srv/tasks", "/var/lib", "/usr/local")
    for path in covered:
        assert not any(
            path == ex or path.startswith(ex.rstrip("/") + "/") for ex in scope.disk_excludes
        ), path
    assert "kernel.random.*" in scope.sysctl_volatile
    assert "bench-warm-harbor.service" in scope.waiting_units
