"""Freeze, verify and reset on the real lab VM, through the ``runner`` commands.

The tests run in file order on one frozen lab (tests/vm_fixtures.py): the audit passes on the
frozen guest, names each planted drift (a package removed, a pinned file edited, a file added
to a frozen tree, a new listening port, the egress firewall's table deleted), and passes again
after a reset, which also removed the planted files and loaded the firewall again.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.freeze.record import guest_transport
from runner.lab.egress import TABLE
from runner.lab.state import LabState
from runner.verify.report import VerifyReport
from tests.support.vm_fixtures import frozen_lab, vm_lab  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.vm, pytest.mark.guest]

# Packages nothing else in the image depends on, so `dpkg --remove` takes them alone.
REMOVABLE = ("unzip", "xz-utils", "less", "nano")
PLANTED_FILE = "/opt/planted-by-test"
PLANTED_PORT = 8765


def runner(*args: str, lab: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runner", *args, "--lab", lab], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def manifest(lab: LabState) -> FreezeManifest:
    return read_model(FreezePaths.for_lab(lab.lab).manifest, FreezeManifest)


def test_verify_passes_on_the_frozen_guest(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    result = runner(
        "verify",
        "--json",
        str(tmp_path / "v.json"),
        "--junit",
        str(tmp_path / "v.xml"),
        lab=frozen_lab.lab,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = VerifyReport.model_validate_json((tmp_path / "v.json").read_bytes())
    assert report.passed and report.freeze_manifest_sha256 == manifest(frozen_lab).sha256
    categories = {check.partition(":")[0] for check in report.checks}
    assert {"kernel", "dpkg", "tree", "listen", "nft"} <= categories
    assert manifest(frozen_lab).state.nft_tables[f"inet {TABLE}"] != "absent"
    junit = ET.parse(tmp_path / "v.xml").getroot()
    assert junit.get("failures") == "0" and int(junit.get("tests", "0")) == len(report.checks)
    assert list(Path(report.evidence).glob("artifacts/*/job_events/*.json"))


def test_verify_names_each_planted_drift(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    frozen = manifest(frozen_lab)
    package = next(name for name in REMOVABLE if name in frozen.state.packages)
    pinned = sorted(
        path for path, entry in frozen.state.files.items() if entry.startswith("sha256:")
    )
    edited = pinned[0] if pinned else "/usr/local/bin/planted-by-test"
    with guest_transport(frozen_lab).connect(60) as guest:
        guest.check(f"dpkg --remove {package}", timeout=300)
        guest.check(f"echo drift >> {shlex.quote(edited)}", timeout=60)
        guest.check(f"echo drift > {PLANTED_FILE}", timeout=60)
        guest.check(
            f"setsid nohup python3 -m http.server {PLANTED_PORT} >/dev/null 2>&1 "
            "< /dev/null & sleep 5",
            timeout=60,
        )
        guest.check(f"nft delete table inet {TABLE}", timeout=60)

    result = runner("verify", "--json", str(tmp_path / "v.json"), lab=frozen_lab.lab)

    assert result.returncode == 1, result.stdout + result.stderr
    checks = {drift["check"] for drift in json.loads((tmp_path / "v.json").read_text())["drifts"]}
    assert {
        f"dpkg:{package}",
        f"file:{edited}",
        f"tree:/opt/{PLANTED_FILE.rsplit('/', 1)[1]}",
        f"listen:tcp/{PLANTED_PORT}",
        f"nft:inet {TABLE}",
    } <= checks, result.stdout
    assert f"dpkg:{package}: expected {frozen.state.packages[package]}" in result.stdout
    assert "drifts from freeze" in result.stderr


def test_reset_returns_to_the_frozen_state(frozen_lab: LabState) -> None:  # noqa: F811
    result = runner("reset", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SSH answering after" in result.stdout
    with guest_transport(frozen_lab).connect(60) as guest:
        assert guest.exec(f"test -e {PLANTED_FILE}", timeout=60).exit_code == 1
    verified = runner("verify", lab=frozen_lab.lab)
    assert verified.returncode == 0, verified.stdout + verified.stderr
