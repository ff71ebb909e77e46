"""Freeze, verify and reset on the real lab VM, through the ``runner`` commands.

The tests run in file order on one frozen lab (tests/support/vm_fixtures.py). First the audit
must find nothing where nothing changed: on the frozen guest, after a second fresh freeze of the
same lab, and after a reset. Then every change of PLANTS is made in the running guest at once
(one verify under TCG costs ~25 s), `runner verify` must exit 1, and each change has its own
test naming the drifts it must cause. A last reset must take every one of them away.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.freeze.record import guest_transport
from runner.lab.egress import TABLE
from runner.lab.state import LabState
from runner.proxy.bearer import new_bearer
from runner.verify.report import VerifyReport
from tests.support.vm_fixtures import frozen_lab, vm_lab  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.vm, pytest.mark.guest]

# A package nothing else in the image depends on, with few files: `dpkg --remove` takes it alone.
REMOVED_PACKAGE = "unzip"
PLANTED_PORT = 8765
UNIT = "planted-by-test.service"
UNIT_TEXT = (
    "[Unit]\\nDescription=planted by a test\\n[Service]\\nType=oneshot\\nRemainAfterExit=yes\\n"
    "ExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n"
)

# name -> (what is done in the running guest, drift checks that must name it). The first nine
# are the rows of issue #17's table, each once missed by the audit that only knew its scope.
PLANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sysctl_file": (
        "printf 'net.ipv4.ip_forward=1\\n' > /etc/sysctl.d/99-x.conf",
        ("disk:/etc/sysctl.d/99-x.conf",),
    ),
    "sshd_root_login": (
        "echo 'PermitRootLogin yes' >> /etc/ssh/sshd_config",
        ("disk:/etc/ssh/sshd_config",),
    ),
    "package_binary_replaced": ("cp /usr/bin/true /usr/bin/git", ("package:git/usr/bin/git",)),
    "uid0_user": (
        "echo 'planted:x:0:0::/root:/bin/bash' >> /etc/passwd",
        ("disk:/etc/passwd", "account:user:planted"),
    ),
    "apt_source": (
        "echo 'deb http://deb.example.invalid/ trixie main' > /etc/apt/sources.list.d/x.list",
        ("disk:/etc/apt/sources.list.d/x.list",),
    ),
    "bearer_in_history": (
        f"echo 'curl -H \"Authorization: Bearer {new_bearer()}\"' >> /root/.bash_history",
        ("disk:/root/.bash_history",),
    ),
    "cron_job": ("echo '* * * * * root true' > /etc/cron.d/x", ("disk:/etc/cron.d/x",)),
    "stdlib_edited": (
        "echo '# planted' >> /usr/lib/python3.13/json/__init__.py",
        ("package:libpython3.13-minimal/usr/lib/python3.13/json/__init__.py",),
    ),
    "hosts_redirect": (
        "echo '203.0.113.7 api.anthropic.com' >> /etc/hosts",
        ("disk:/etc/hosts",),
    ),
    "package_file_removed": ("rm /usr/bin/chsh", ("package:passwd/usr/bin/chsh",)),
    "setuid_mode": ("chmod u-s /usr/bin/passwd", ("package:passwd/usr/bin/passwd",)),
    "unit_enabled": (
        f"printf '{UNIT_TEXT}' > /etc/systemd/system/{UNIT} && systemctl daemon-reload"
        f" && systemctl enable --now {UNIT}",
        (
            f"disk:/etc/systemd/system/{UNIT}",
            f"disk:/etc/systemd/system/multi-user.target.wants/{UNIT}",
            f"unit:{UNIT}",
        ),
    ),
    # (Podman's network stack has set ip_forward already: another effective value is changed.)
    "sysctl_value": ("sysctl -q -w kernel.sysrq=7", ("sysctl:kernel.sysrq",)),
    "module_loaded": ("modprobe dummy", ("module:dummy",)),
    "process_left": (
        "setsid nohup sleep 100000 >/dev/null 2>&1 < /dev/null &",
        ("process:/usr/bin/sleep",),
    ),
    "package_removed": (f"dpkg --remove {REMOVED_PACKAGE}", (f"dpkg:{REMOVED_PACKAGE}",)),
    "port_listening": (
        f"setsid nohup python3 -m http.server {PLANTED_PORT} >/dev/null 2>&1 < /dev/null & sleep 5",
        (f"listen:tcp/{PLANTED_PORT}",),
    ),
    "egress_table_deleted": (
        f"nft delete table inet {TABLE}",
        (f"nft:inet {TABLE}", "ruleset:ruleset"),
    ),
}


def runner(*args: str, lab: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runner", *args, "--lab", lab], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def manifest(lab: LabState) -> FreezeManifest:
    return read_model(FreezePaths.for_lab(lab.lab).manifest, FreezeManifest)


def verify_passes(lab: LabState, tmp_path: Path) -> VerifyReport:
    result = runner(
        "verify",
        "--json",
        str(tmp_path / "v.json"),
        "--junit",
        str(tmp_path / "v.xml"),
        lab=lab.lab,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = VerifyReport.model_validate_json((tmp_path / "v.json").read_bytes())
    assert report.passed and report.freeze_manifest_sha256 == manifest(lab).sha256
    return report


def test_verify_passes_on_the_frozen_guest(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    report = verify_passes(frozen_lab, tmp_path)
    categories = {check.partition(":")[0] for check in report.checks}
    assert {"disk", "package", "kernel", "dpkg", "listen", "nft", "module", "sysctl"} <= categories
    assert {"mount", "ruleset", "unit", "process", "account"} <= categories  # (no containers)
    frozen = manifest(frozen_lab)
    assert report.disk_paths == frozen.state.disk.paths > 50_000
    assert frozen.state.disk.package_files > 5_000
    assert frozen.state.nft_tables[f"inet {TABLE}"] != "absent"
    junit = ET.parse(tmp_path / "v.xml").getroot()
    assert junit.get("failures") == "0" and int(junit.get("tests", "0")) == len(report.checks)
    assert list(Path(report.evidence).glob("artifacts/*/job_events/*.json"))


def test_a_second_fresh_freeze_of_the_same_lab_passes_too(
    frozen_lab: LabState,  # noqa: F811
    tmp_path: Path,
) -> None:
    first = manifest(frozen_lab).sha256
    result = runner("freeze", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "of the disk on the host" in result.stdout
    assert manifest(frozen_lab).sha256 != first  # a new freeze (a new save: a new memory image)
    verify_passes(frozen_lab, tmp_path)


def test_verify_passes_after_a_reset(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    result = runner("reset", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    verify_passes(frozen_lab, tmp_path)


@pytest.fixture(scope="module")
def planted(frozen_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """Every change of PLANTS made in the running guest, then one `runner verify`."""
    with guest_transport(frozen_lab).connect(60) as guest:
        for command, _ in PLANTS.values():
            guest.check(command, timeout=300)
    report = tmp_path_factory.mktemp("planted") / "v.json"
    result = runner("verify", "--json", str(report), lab=frozen_lab.lab)
    return {"result": result, "report": json.loads(report.read_text())}


@pytest.mark.parametrize("name", list(PLANTS))
def test_verify_names_each_planted_change(planted: dict[str, Any], name: str) -> None:
    result = planted["result"]
    assert result.returncode == 1, result.stdout + result.stderr
    assert "drifts from freeze" in result.stderr
    checks = {drift["check"] for drift in planted["report"]["drifts"]}
    _, expected = PLANTS[name]
    assert set(expected) <= checks, f"{name}: {sorted(set(expected) - checks)} not named"


def test_a_changed_package_file_names_its_package_and_both_digests(planted: dict[str, Any]) -> None:
    [drift] = [d for d in planted["report"]["drifts"] if d["check"] == "package:git/usr/bin/git"]
    assert drift["expected"].startswith("file 0755 0:0 sha256:")
    assert " (md5 " in drift["expected"] and " (md5 " in drift["found"]
    assert drift["expected"] != drift["found"]


def test_reset_takes_every_planted_change_away(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    result = runner("reset", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SSH answering after" in result.stdout
    with guest_transport(frozen_lab).connect(60) as guest:
        assert guest.exec("test -e /etc/cron.d/x", timeout=60).exit_code == 1
        assert guest.exec("lsmod | grep -q '^dummy '", timeout=60).exit_code == 1
    verify_passes(frozen_lab, tmp_path)
