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
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from runner.core.files import read_model
from runner.core.roots import REPO_ROOT
from runner.freeze.manifest import FreezeManifest
from runner.freeze.paths import FreezePaths
from runner.lab.egress import TABLE
from runner.lab.state import LabState
from runner.lab.transport import SshTransport
from runner.proxy.bearer import new_bearer
from runner.verify.report import VerifyReport
from tests.support.runner_cli import on_lab
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


def on_each_process_of(executable: str, command: str) -> str:
    """A guest command: ``command`` (which reads ``$pid``) for each process running
    ``executable``. It fails when none runs it or the command fails for one (a plain for loop
    over /proc exits with its last test's status: 1 whenever the last process is another's)."""
    return (
        f'pids=$(for p in /proc/[0-9]*; do [ "$(readlink $p/exe)" = {executable} ]'
        " && echo ${p#/proc/}; done; true)"
        f' && [ -n "$pids" ] && for pid in $pids; do {command} || exit 1; done'
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
        f"setsid nohup python3 -m http.server {PLANTED_PORT} >/dev/null 2>&1 < /dev/null & "
        # polled until it listens (at most 60 s under TCG), not a fixed wait
        f"for _ in $(seq 600); do ss -Hltn 'sport = :{PLANTED_PORT}' | grep -q . && break; "
        "sleep 0.1; done",
        (f"listen:tcp/{PLANTED_PORT}",),
    ),
    "egress_table_deleted": (
        f"nft delete table inet {TABLE}",
        (f"nft:inet {TABLE}", "ruleset:ruleset"),
    ),
    # Issue #23's classes, each once passed unseen (the live state a cell can feel).
    "route_added": (
        "ip route add blackhole 198.51.100.0/24",
        ("network:route:4:main:blackhole:198.51.100.0/24::0",),
    ),
    "manager_environment": (
        "systemctl set-environment PLANTED_BY_TEST=1",
        ("manager:env:PLANTED_BY_TEST",),
    ),
    "runtime_cpu_quota": (
        "systemctl set-property --runtime system-getty.slice CPUQuota=20%",
        (
            "manager:unit:system-getty.slice",
            "manager:cgroup:/system.slice/system-getty.slice/cpu.max",
            "tmpfs:/run/systemd/system.control/system-getty.slice.d/50-CPUQuota.conf",
        ),
    ),
    "file_in_dev_shm": ("echo planted > /dev/shm/planted", ("tmpfs:/dev/shm/planted",)),
    "thp_knob": (
        "echo never > /sys/kernel/mm/transparent_hugepage/enabled",
        ("sysfs:/sys/kernel/mm/transparent_hugepage/enabled",),
    ),
    # A process in the cgroup the old scope left out by glob (user@*.service).
    "process_in_old_excluded_cgroup": (
        "g=/sys/fs/cgroup/user.slice/user-0.slice/user@0.service/planted; mkdir -p $g && {"
        " setsid nohup tail -f /dev/null >/dev/null 2>&1 </dev/null & echo $! >$g/cgroup.procs; }",
        ("process:/usr/bin/tail",),
    ),
    # Live state of classes #23 names that its first plants did not try.
    "traffic_control": (
        "tc qdisc replace dev lo root handle 1: pfifo limit 1000",
        ("network:tc:lo:qdisc:1:",),
    ),
    "policy_rule": (
        "ip rule add priority 1234 from 198.51.100.0/24 table main",
        ("network:rule:4:1234",),
    ),
    "permanent_neighbour": (
        # On the first link that is not loopback (user-mode networking gives no default route).
        "ip neigh add 198.51.100.9 lladdr 02:00:00:00:00:09 nud permanent dev"
        " $(ip -o link show | awk -F': ' '$2 != \"lo\" { sub(/@.*/, \"\", $2); print $2; exit }')",
        ("network:neigh:*",),
    ),
    "listener_reniced": (
        on_each_process_of("/usr/sbin/sshd", "renice -n 10 -p $pid >/dev/null"),
        ("scheduling:/usr/sbin/sshd",),
    ),
    "journald_limit_lowered": (
        on_each_process_of(
            "/usr/lib/systemd/systemd-journald", "prlimit --pid $pid --msgqueue=1234:1234"
        ),
        ("scheduling:/usr/lib/systemd/systemd-journald",),
    ),
    "cgroup_limit_written": (
        "echo 4096 > /sys/fs/cgroup/system.slice/pids.max",
        ("manager:cgroup:/system.slice/pids.max",),
    ),
    "cgroup_frozen": (
        "echo 1 > /sys/fs/cgroup/system.slice/system-getty.slice/cgroup.freeze",
        ("manager:cgroup:/system.slice/system-getty.slice/cgroup.freeze",),
    ),
    "swap_on": (
        "dd if=/dev/zero of=/planted.swap bs=1M count=16 status=none && chmod 600 /planted.swap"
        " && mkswap -q /planted.swap && swapon /planted.swap",
        ("sysfs:swap:/planted.swap", "disk:/planted.swap"),
    ),
    "file_in_run": ("echo planted > /run/planted", ("tmpfs:/run/planted",)),
    "module_parameter": (
        "echo Y > /sys/module/printk/parameters/ignore_loglevel",
        ("sysfs:/sys/module/printk/parameters/ignore_loglevel",),
    ),
    # A bind mount over a file inside a Podman image layer (the old scope's excluded prefix).
    "bind_over_podman_layer": (
        "f=$(find /var/lib/containers/storage/overlay/*/diff/usr/bin -maxdepth 1 -type f"
        " -name 'env' | head -1) && mount --bind /usr/bin/true $f",
        ("mount:/var/lib/containers/storage/overlay/*",),
    ),
}


# What this tier measured of the audit (verify and freeze seconds, the planted verify's drift
# lines), for the tier's log: scripts/test.sh prints the file after the guest tier. Nothing in
# it is asserted (speed goals are bench/'s).
FIGURES = REPO_ROOT / ".cache" / "audit-figures.log"


def note(text: str) -> None:
    with FIGURES.open("a") as figures:
        figures.write(text.rstrip("\n") + "\n")


def runner(*args: str, lab: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = on_lab(*args, lab=lab)
    note(
        f"runner {args[0]} --lab {lab}: exit {done.returncode}, {time.monotonic() - started:.1f} s"
    )
    return done


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
    note(result.stdout.splitlines()[-1])
    report = VerifyReport.model_validate_json((tmp_path / "v.json").read_bytes())
    assert report.passed and report.freeze_manifest_sha256 == manifest(lab).sha256
    return report


def test_verify_passes_on_the_frozen_guest(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    report = verify_passes(frozen_lab, tmp_path)
    categories = {check.partition(":")[0] for check in report.checks}
    assert {"disk", "package", "kernel", "dpkg", "listen", "nft", "module", "sysctl"} <= categories
    assert {"mount", "ruleset", "unit", "process", "account"} <= categories  # (no containers)
    assert {"network", "manager", "tmpfs", "sysfs", "scheduling", "slower"} <= categories
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
    steps = next(line for line in result.stdout.splitlines() if line.startswith("steps (s)"))
    assert all(f" {step} " in steps for step in ("prepare", "guest", "save", "disk")), steps
    note(steps)
    assert manifest(frozen_lab).sha256 != first  # a new freeze (a new save: a new memory image)
    verify_passes(frozen_lab, tmp_path)


def test_verify_passes_after_a_reset(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    result = runner("reset", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    verify_passes(frozen_lab, tmp_path)


@pytest.fixture(scope="module")
def planted(frozen_lab: LabState, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """Every change of PLANTS made in the running guest, then one `runner verify`."""
    with SshTransport.for_lab(frozen_lab).connect(60) as guest:
        for command, _ in PLANTS.values():
            guest.check(command, timeout=300)
    report = tmp_path_factory.mktemp("planted") / "v.json"
    result = runner("verify", "--json", str(report), lab=frozen_lab.lab)
    note(f"planted verify: {result.stderr.strip()}\n{result.stdout}")
    return {"result": result, "report": json.loads(report.read_text())}


@pytest.mark.parametrize("name", list(PLANTS))
def test_verify_names_each_planted_change(planted: dict[str, Any], name: str) -> None:
    result = planted["result"]
    assert result.returncode == 1, result.stdout + result.stderr
    assert "drifts from freeze" in result.stderr
    checks = {drift["check"] for drift in planted["report"]["drifts"]}
    _, expected = PLANTS[name]
    # A check ending in "*" names a drift whose check starts so (a path found in the guest).
    missing = [
        check
        for check in expected
        if not (
            any(c.startswith(check[:-1]) for c in checks)
            if check.endswith("*")
            else check in checks
        )
    ]
    assert not missing, f"{name}: {missing} not named"


def test_a_changed_package_file_names_its_package_and_both_digests(planted: dict[str, Any]) -> None:
    [drift] = [d for d in planted["report"]["drifts"] if d["check"] == "package:git/usr/bin/git"]
    assert drift["expected"].startswith("file 0755 0:0 sha256:")
    assert " (md5 " in drift["expected"] and " (md5 " in drift["found"]
    assert drift["expected"] != drift["found"]


def test_reset_takes_every_planted_change_away(frozen_lab: LabState, tmp_path: Path) -> None:  # noqa: F811
    result = runner("reset", lab=frozen_lab.lab)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SSH answering after" in result.stdout
    with SshTransport.for_lab(frozen_lab).connect(60) as guest:
        assert guest.exec("test -e /etc/cron.d/x", timeout=60).exit_code == 1
        assert guest.exec("lsmod | grep -q '^dummy '", timeout=60).exit_code == 1
    verify_passes(frozen_lab, tmp_path)
