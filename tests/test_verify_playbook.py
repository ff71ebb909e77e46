"""The audit playbook generated from a manifest: one case per file in verify_playbook_cases/.

Each case gives a scope and what the guest's collection script reported; the harness checks the
expectation maps the playbook carries, and that each probe's guest command contains (or lacks)
the given fragments (quoting of paths, globs left to bash).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runner.verify.playbook import (
    CHECK_TASK_PREFIX,
    PROBES,
    TREE_LISTING_TASK,
    build_playbook,
    tree_listing_command,
)
from tests.support.freeze_factory import manifest_of

CASES = sorted((Path(__file__).parent / "verify_playbook_cases").glob("*.json"))


@pytest.mark.parametrize("case_path", CASES, ids=[path.stem for path in CASES])
def test_playbook_from_manifest(case_path: Path) -> None:
    case = json.loads(case_path.read_text())
    manifest = manifest_of(case["scope"], case["collected"])
    # What ansible-runner is given is YAML: the generated playbook must survive the round trip.
    [play] = yaml.safe_load(yaml.safe_dump(build_playbook(manifest)))

    assert play["vars"]["expected"] == case["expected"]
    tasks = {task["name"]: task for task in play["tasks"]}
    for category, fragments in case["commands"].items():
        command = tasks[f"observe {category}"]["ansible.builtin.raw"]
        for fragment in fragments:
            assert fragment in command, f"{category}: {fragment!r} not in {command!r}"
    for category, fragments in case["commands_lack"].items():
        command = tasks[f"observe {category}"]["ansible.builtin.raw"]
        for fragment in fragments:
            assert fragment not in command


def test_every_observation_is_read_only_and_runs_in_check_mode() -> None:
    manifest = manifest_of({"files": [], "trees": ["/opt"]}, _empty_collected())
    [play] = build_playbook(manifest)
    observations = [t for t in play["tasks"] if "ansible.builtin.raw" in t]
    assert len(observations) == len(PROBES) + 1  # one per probe, plus the drifted-tree listing
    for task in observations:
        assert task["check_mode"] is False and task["changed_when"] is False
        assert task["ansible.builtin.raw"].startswith("set -o pipefail; ")
    checks = [t for t in play["tasks"] if t["name"].startswith(CHECK_TASK_PREFIX)]
    assert [t["name"] for t in checks] == [f"check {p.category}" for p in PROBES]
    assert all(t["ignore_errors"] is True for t in checks)  # every drift is reported, not the first


def test_drifted_tree_listing_only_runs_for_trees_that_differ() -> None:
    manifest = manifest_of({"files": [], "trees": ["/opt", "/srv"]}, _empty_collected())
    [play] = build_playbook(manifest)
    [listing] = [t for t in play["tasks"] if t["name"] == TREE_LISTING_TASK]
    assert listing["loop"] == ["/opt", "/srv"]
    assert listing["when"] == "observed.tree.get(item) != expected.tree.get(item)"
    assert listing["vars"]["commands"]["/srv"] == tree_listing_command("/srv", manifest.scope)


def _empty_collected() -> dict[str, object]:
    return {
        "kernel": "k",
        "packages": {},
        "files": {},
        "trees": {},
        "venvs": {},
        "images": [],
        "listening": [],
    }
