"""``runner verify [--lab NAME] [--json FILE] [--junit FILE] [--run-dir DIR]``."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.options import lab_option
from runner.core.canonical import canonical_json
from runner.core.errors import RunnerError
from runner.core.files import write_atomic
from runner.freeze.paths import FreezePaths
from runner.freeze.record import load_freeze
from runner.lab.state import LabPaths, load_lab_state
from runner.records.paths import RunPaths
from runner.verify.audit import audit_lab, render_drifts
from runner.verify.junit import junit_xml


class DriftFound(RunnerError):
    """The guest is not in its frozen state."""


@click.command("verify")
@lab_option
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Also write the VerifyReport here."
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    help="Also write JUnit XML here (one testcase per check).",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Keep the audit's evidence in this run dir's verify/ (default: the lab's).",
)
def verify_command(
    lab: str, json_path: Path | None, junit_path: Path | None, run_dir: Path | None
) -> None:
    """Audit the guest against its freeze: its whole disk read on the host (every path, every
    package file against its package's digest) and its live state with Ansible (check mode);
    exit 1 and one line per drift (check, expected, found) when anything differs."""
    manifest, _saved = load_freeze(lab)
    state = load_lab_state(LabPaths.for_lab(lab))
    evidence = RunPaths(run_dir).verify_dir if run_dir else FreezePaths.for_lab(lab).verify_dir
    report = audit_lab(state, evidence)
    if json_path is not None:
        write_atomic(json_path, canonical_json(report) + b"\n")
    if junit_path is not None:
        write_atomic(junit_path, junit_xml(report))
    click.echo(f"evidence: {report.evidence}")
    if not report.passed:
        click.echo(render_drifts(report))
        raise DriftFound(
            f"{len(report.drifts)} drifts from freeze {manifest.sha256} "
            f"({len(report.checks)} checks, {report.seconds:.1f} s)"
        )
    click.echo(
        f"verify: {len(report.checks)} checks ({report.disk_paths} paths of the disk), no drift "
        f"from freeze {manifest.sha256} ({report.seconds:.1f} s, disk {report.disk_seconds} s)"
    )
