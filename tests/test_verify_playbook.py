"""The audit playbook generated from a manifest: one case per file in verify_playbook_cases/.

Each case gives a scope, what the guest's collection script reported and the live state the
freeze recorded; the harness checks the expectation maps the playbook carries, and that each
probe's guest command contains (or lacks) the given fragments (quoting, globs as EREs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from runner.freeze.live import LIVE_PROBES
from runner.verify.playbook import (
    CHECK_TASK_PREFIX,
    OBSERVE_LIVE_TASK,
    OBSERVE_REST_TASK,
    PROBES,
    build_playbook,
)
from tests.support.freeze_factory import manifest_of
from tests.support.playbook_commands import commands_of

CASES = sorted((Path(__file__).parent / "verify_playbook_cases").glob("*.json"))
RAW_START, RAW_END = "{% raw %}set -o pipefail; ", "{% endraw %}"
COLLECTED: dict[str, object] = {"kernel": "k", "packages": {}, "images": [], "listening": []}
# A freeze that recorded every live category (each empty).
EVERY_LIVE: dict[str, dict[str, str]] = {probe.category: {} for probe in LIVE_PROBES}


@pytest.mark.parametrize("case_path", CASES, ids=[path.stem for path in CASES])
def test_playbook_from_manifest(case_path: Path) -> None:
    case = json.loads(case_path.read_text())
    manifest = manifest_of(case["scope"], case["collected"], live=case.get("live"))
    # What ansible-runner is given is YAML: the generated playbook must survive the round trip.
    [play] = yaml.safe_load(yaml.safe_dump(build_playbook(manifest)))

    assert play["vars"]["expected"] == case["expected"]
    commands = commands_of(play)
    for category, fragments in case["commands"].items():
        command = commands[category]
        for fragment in fragments:
            assert fragment in command, f"{category}: {fragment!r} not in {command!r}"
    for category, fragments in case["commands_lack"].items():
        command = commands[category]
        for fragment in fragments:
            assert fragment not in command


def test_every_observation_is_read_only_literal_and_runs_in_check_mode() -> None:
    manifest = manifest_of({}, COLLECTED, live=EVERY_LIVE)
    [play] = build_playbook(manifest)
    observations = [t for t in play["tasks"] if "ansible.builtin.raw" in t]
    assert [t["name"] for t in observations] == [OBSERVE_LIVE_TASK, OBSERVE_REST_TASK]
    assert sorted(commands_of(play)) == sorted(p.category for p in PROBES)
    for task in observations:
        assert task["check_mode"] is False and task["changed_when"] is False
        raw = task["ansible.builtin.raw"]
        # No Jinja in the guest's command: podman's Go templates and bash's ${...} stay as is.
        assert raw.startswith(RAW_START) and raw.endswith(RAW_END), raw
        assert raw.count("{% raw %}") == 1 and raw.count(RAW_END) == 1
        assert task["args"] == {"executable": "/bin/bash"}  # pipefail, read -a, $'\t'
    checks = [t for t in play["tasks"] if t["name"].startswith(CHECK_TASK_PREFIX)]
    assert [t["name"] for t in checks] == [f"check {p.category}" for p in PROBES]
    assert all(t["ignore_errors"] is True for t in checks)  # every drift is reported, not the first
    assert not any("loop" in t for t in play["tasks"])  # no drifted-tree listing any more


def test_the_audit_runs_the_live_commands_the_freeze_ran() -> None:
    scope = {"sysctl_volatile": ["kernel.random.*"], "process_exe_excludes": ["/usr/bin/x"]}
    manifest = manifest_of(scope, COLLECTED, live=EVERY_LIVE)
    [play] = build_playbook(manifest)
    commands = commands_of(play)
    assert {p.category for p in LIVE_PROBES} <= {p.category for p in PROBES}
    for live in LIVE_PROBES:
        # runner.freeze.record.observe_live runs the same commands, at once as here.
        assert commands[live.category] == live.command(manifest.scope)


def test_a_live_value_with_tabs_stays_whole_in_the_observed_map() -> None:
    """The live maps split each line at its first tab only (a value may hold more)."""
    [play] = build_playbook(manifest_of({}, COLLECTED, live=EVERY_LIVE))
    [gather] = [t for t in play["tasks"] if t["name"] == "gather what was observed"]
    observed = gather["ansible.builtin.set_fact"]["observed"]
    for live in LIVE_PROBES:
        assert observed[live.category] == (
            f"{{{{ dict({live.category}_seen.stdout_lines | map('split', '\t', 1)) }}}}"
        )
    assert observed["kernel"] == "{{ dict(kernel_seen.stdout_lines | map('split', '\t', -1)) }}"
