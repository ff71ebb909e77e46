"""The live categories of #23 (runner.freeze.live: network, manager, tmpfs, sysfs; mounts and
processes by identity; the speed probe), each run with bash on recorded fixtures: the guest's
tools (ip, findmnt, systemctl, loginctl) are stand-ins on PATH printing what a guest printed,
and a plant in them (a changed route, a runtime drop-in with a CPUQuota, a file in /dev/shm, a
bind mount over a file in a Podman layer, a THP knob) must change the map the audit compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from runner.core.errors import InputError
from runner.freeze import live, manifest
from runner.freeze.live import LATE_CATEGORIES, LIVE_PROBES, SPEED_COMMAND, parse_lines
from runner.freeze.manifest import FreezeScope, SpeedFigures, default_scope
from runner.verify.audit import compare_speed, unrecorded
from runner.verify.playbook import OBSERVE_LIVE_TASK, SPEED_TASK, build_playbook, probes_for
from tests.support.freeze_factory import manifest_of
from tests.test_live_probes import run

COLLECTED: dict[str, object] = {"kernel": "k", "packages": {}, "images": [], "listening": []}


def probe(category: str) -> live.LiveProbe:
    [found] = [p for p in LIVE_PROBES if p.category == category]
    return found


def run_probe(
    category: str, scope: FreezeScope, tools: Path | None = None, new_session: bool = True
) -> dict[str, str]:
    env = {**os.environ}
    if tools is not None:
        env["PATH"] = f"{tools}:{env['PATH']}"
    done = run(probe(category).command(scope), new_session=new_session, env=env)
    assert done.returncode == 0, done.stderr
    return parse_lines(done.stdout)


def stand_in(tools: Path, name: str, script: str) -> None:
    """A stand-in for a guest tool: a bash script on PATH."""
    tools.mkdir(exist_ok=True)
    path = tools / name
    path.write_text(f"#!/bin/bash\n{script}\n")
    path.chmod(0o755)


# --- network ---------------------------------------------------------------------------------

LINKS = [
    {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP"], "operstate": "UNKNOWN"},
    {
        "ifindex": 2,
        "ifname": "eth0",
        "flags": ["UP"],
        "operstate": "UP",
        "linkinfo": {"info_kind": "virtio"},
        "stats64": {"rx": {"bytes": 1}},
    },
]
ADDRS = [
    {
        "ifname": "eth0",
        "addr_info": [
            {"family": "inet", "local": "10.0.2.15", "prefixlen": 24, "valid_life_time": 86000},
        ],
    }
]
ROUTES = [
    {"dst": "default", "gateway": "10.0.2.2", "dev": "eth0", "table": "main", "metric": 100},
    {"dst": "10.0.2.0/24", "dev": "eth0", "table": "main", "expires": 30},
]
NEIGHBOURS = [
    {"dst": "10.0.2.2", "dev": "eth0", "lladdr": "52:55:0a:00:02:02", "state": ["REACHABLE"]},
    {"dst": "10.0.2.9", "dev": "eth0", "lladdr": "52:55:0a:00:02:09", "state": ["PERMANENT"]},
]


QDISCS = [{"kind": "fq_codel", "handle": "0:", "root": True, "refcnt": 2, "options": {}}]


def ip_stand_in(
    tools: Path,
    data: Path,
    routes: list[dict[str, Any]],
    eth0_qdiscs: list[dict[str, Any]] = QDISCS,
) -> None:
    """``ip -j`` and ``tc -j`` as a guest answered them (IPv6 with nothing; eth0's queueing
    disciplines as given, no classes or filters)."""
    for name, value in (
        ("link", LINKS),
        ("addr", ADDRS),
        ("route", routes),
        ("neigh", NEIGHBOURS),
        ("rule", [{"priority": 0, "src": "all", "table": "local"}]),
        ("qdisc-eth0", eth0_qdiscs),
    ):
        (data / f"{name}.json").write_text(json.dumps(value))
    stand_in(
        tools,
        "ip",
        f'd={shlex.quote(str(data))}; case " $* " in *" -6 "*) echo "[]"; exit;; esac;'
        ' for w in "$@"; do case $w in link|addr|route|neigh|rule) cat "$d/$w.json"; exit;;'
        " esac; done; exit 1",
    )
    stand_in(tools, "tc", f'cat {shlex.quote(str(data))}/"$2-$5.json" 2>/dev/null || echo "[]"')


def network_seen(
    tmp_path: Path, routes: list[dict[str, Any]], eth0_qdiscs: list[dict[str, Any]] = QDISCS
) -> dict[str, str]:
    """The network probe's map with ip and tc answering as given."""
    tools, data = tmp_path / "tools", tmp_path / "data"
    data.mkdir(exist_ok=True)
    ip_stand_in(tools, data, routes, eth0_qdiscs)
    return run_probe("network", default_scope(), tools)


def test_the_network_probe_records_a_changed_route_and_no_lifetimes(tmp_path: Path) -> None:
    frozen = network_seen(tmp_path, ROUTES)
    changed = [{**ROUTES[0], "gateway": "10.0.2.3"}, {**ROUTES[1], "expires": 12}]
    now = network_seen(tmp_path, changed)

    default = "route:4:main:unicast:default:eth0:100"
    assert json.loads(frozen[default])["gateway"] == "10.0.2.2"
    assert json.loads(now[default])["gateway"] == "10.0.2.3"  # the plant: one key, two values
    # A lifetime counting down is no change: the other route's value stays.
    other = "route:4:main:unicast:10.0.2.0/24:eth0:0"
    assert frozen[other] == now[other] and "expires" not in frozen[other]
    assert {k for k in frozen if frozen[k] != now[k]} == {default}
    assert json.loads(frozen["link:eth0"])["linkinfo"] == {"info_kind": "virtio"}
    assert "stats64" not in frozen["link:eth0"]
    assert "valid_life_time" not in frozen["addr:eth0:10.0.2.15/24"]
    # Permanent neighbours only (the scope's states); the reachable one is the kernel's cache.
    assert "neigh:eth0:10.0.2.9" in frozen and "neigh:eth0:10.0.2.2" not in frozen
    assert "rule:4:0" in frozen
    assert json.loads(frozen["tc:eth0:qdisc:0:"])["kind"] == "fq_codel"
    assert "refcnt" not in frozen["tc:eth0:qdisc:0:"]


def test_the_network_probe_records_a_links_traffic_control(tmp_path: Path) -> None:
    frozen = network_seen(tmp_path, ROUTES)
    netem = {"kind": "netem", "handle": "8001:", "root": True, "refcnt": 2}
    delayed = network_seen(tmp_path, ROUTES, [{**netem, "options": {"delay": {"delay": 0.1}}}])
    longer = network_seen(tmp_path, ROUTES, [{**netem, "options": {"delay": {"delay": 0.2}}}])

    changed = {k for k in frozen.keys() | delayed.keys() if frozen.get(k) != delayed.get(k)}
    assert changed == {"tc:eth0:qdisc:0:", "tc:eth0:qdisc:8001:"}
    # The discipline's own parameters are its value: another delay is another value.
    assert delayed["tc:eth0:qdisc:8001:"] != longer["tc:eth0:qdisc:8001:"]


# --- the service manager -----------------------------------------------------------------------


def systemctl_stand_in(tools: Path, user_slice: str, environment: str) -> None:
    """systemctl as a guest answered it: its environment, its own properties, two active units
    (one the collector's own session scope) and their resource properties."""
    stand_in(
        tools,
        "systemctl",
        'case "$1" in\n'
        f" show-environment) printf '%s\\n' {shlex.quote(environment)} ;;\n"
        " list-units) printf 'user.slice loaded active active x\\n"
        "session-77.scope loaded active running x\\n' ;;\n"
        ' show) if [ $# -eq 1 ]; then printf "LogLevel=info\\nNJobs=3\\n'
        'FinishTimestamp=Mon 2026-12-02\\n"; exit; fi;'
        ' for u in "$@"; do case $u in user.slice)'
        f" printf 'Id=user.slice\\n%s\\n\\n' {shlex.quote(user_slice)} ;;"
        " session-77.scope) printf 'Id=session-77.scope\\nCPUQuotaPerSecUSec=1s\\n\\n' ;;"
        " esac; done ;;\n"
        "esac",
    )


def test_the_manager_probe_sees_a_runtime_drop_in_with_a_cpu_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    cgroups = tmp_path / "cgroup"
    (cgroups / "user.slice" / "user-0.slice" / "session-77.scope").mkdir(parents=True)
    (cgroups / "user.slice" / "cpu.max").write_text("max 100000\n")
    (cgroups / "user.slice" / "user-0.slice" / "session-77.scope" / "cpu.max").write_text("1\n")
    (cgroups / "user.slice" / "cpu.stat").write_text("usage_usec 7\n")  # not a limit
    (cgroups / "user.slice" / "cgroup.freeze").write_text("0\n")
    (cgroups / "user.slice" / "hugetlb.2MB.max").write_text("max\n")
    monkeypatch.setattr(live, "CGROUP_ROOT", str(cgroups))
    # The collector's own session is 77: what loginctl and /proc/self/sessionid would say.
    stand_in(tools, "loginctl", "exit 0")
    scope = default_scope()
    own = Path("/proc/self/sessionid").read_text().strip()
    frozen_slice = "CPUQuotaPerSecUSec=infinity DropInPaths="
    systemctl_stand_in(tools, frozen_slice.replace(" ", "\n"), "LANG=C.UTF-8")
    frozen = run_probe("manager", scope, tools)
    planted_slice = (
        "CPUQuotaPerSecUSec=100ms\nDropInPaths=/run/systemd/system.control/user.slice.d/"
        "50-CPUQuota.conf"
    )
    systemctl_stand_in(tools, planted_slice, "LANG=C.UTF-8\nLD_PRELOAD=/tmp/x.so")
    (cgroups / "user.slice" / "cpu.max").write_text("10000 100000\n")
    (cgroups / "user.slice" / "cgroup.freeze").write_text("1\n")
    now = run_probe("manager", scope, tools)

    assert frozen["unit:user.slice"] == frozen_slice
    assert now["unit:user.slice"] == planted_slice.replace("\n", " ")
    assert frozen["cgroup:/user.slice/cpu.max"] == "max 100000"
    assert now["cgroup:/user.slice/cpu.max"] == "10000 100000"
    assert frozen["cgroup:/user.slice/cgroup.freeze"] == "0"
    assert now["cgroup:/user.slice/cgroup.freeze"] == "1"  # a frozen slice is a limit too
    assert now["cgroup:/user.slice/hugetlb.2MB.max"] == "max"
    assert "cgroup:/user.slice/cpu.stat" not in frozen
    assert now["env:LD_PRELOAD"] == "/tmp/x.so" and "env:LD_PRELOAD" not in frozen
    assert frozen["env:LANG"] == "C.UTF-8"
    assert frozen["manager:LogLevel"] == "info"
    assert "manager:NJobs" not in frozen and "manager:FinishTimestamp" not in frozen
    if own == "77":  # (only where this process is in logind's session 77)
        assert "unit:session-77.scope" not in frozen
    else:  # another session's scope and cgroup are state like any other
        assert frozen["unit:session-77.scope"] == "CPUQuotaPerSecUSec=1s"
        assert "cgroup:/user.slice/user-0.slice/session-77.scope/cpu.max" in frozen


def test_the_identified_sessions_are_the_collectors_own_and_ssh_led_ones(tmp_path: Path) -> None:
    """loginctl names three sessions; the one led by a process running the scope's SSH server
    executable, child of its listener, is identified; one led by another process is not."""
    tools = tmp_path / "tools"
    sshd, listener = tmp_path / "sshd-session", tmp_path / "sshd"
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    for copy in (sshd, listener):
        shutil.copy2(sleep, copy)
    # The listener starts the SSH server process (exec'd by the listener's own bash child).
    parent = subprocess.Popen(
        ["bash", "-c", f"{shlex.quote(str(sshd))} 300 & exec {shlex.quote(str(listener))} 300"],
        start_new_session=True,
    )
    other = subprocess.Popen([str(sleep), "300"], start_new_session=True)
    try:
        for _ in range(50):
            found = subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True)
            if found.stdout.strip():
                break
            time.sleep(0.1)
        child = found.stdout.split()[0]
        stand_in(
            tools,
            "loginctl",
            'case "$1" in list-sessions) printf "5 0 root\\n6 0 root\\n" ;;'
            f' show-session) printf "Id=5\\nLeader={child}\\n\\nLeader={other.pid}\\nId=6\\n" ;;'
            " esac",
        )
        scope = FreezeScope(
            disk_excludes=(),
            ssh_session_executable=str(sshd),
            ssh_listener_executable=str(listener),
        )
        command = live._sessions(scope) + 'printf "%s\\n" $sessions'
        env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
    finally:
        for process in (parent, other):
            process.kill()
            process.wait()
        subprocess.run(["pkill", "-f", f"^{sshd} 300"], check=False)
    sessions = done.stdout.split()
    assert "5" in sessions and "6" not in sessions


# --- tmpfs -------------------------------------------------------------------------------------


def test_the_tmpfs_probe_sees_a_file_in_dev_shm(tmp_path: Path) -> None:
    """Every file of each mount findmnt names as a tmpfs (here a stand-in /dev/shm)."""
    shm, tools = tmp_path / "dev" / "shm", tmp_path / "tools"
    shm.mkdir(parents=True)
    stand_in(tools, "findmnt", f"echo {shlex.quote(str(shm))}")
    own = Path("/proc/self/sessionid").read_text().strip()
    planted = shm / "bench-plant"
    session_dir, moves = shm / f"session-{own}", shm / "utmp"
    scope = FreezeScope(
        disk_excludes=(),
        session_runtime_files=(f"{shm}/session-{{session}}",),
        tmpfs_content_volatile=(str(moves),),
    )
    session_dir.mkdir()
    (session_dir / "below").write_text("x")
    (shm / "session-999999").write_text("another session's")
    (shm / "sock").symlink_to("/run/x")
    moves.write_text("1")
    moves.chmod(0o644)
    frozen = run_probe("tmpfs", scope, tools)
    planted.write_bytes(b"planted\n")
    planted.chmod(0o640)
    moves.write_text("2")
    now = run_probe("tmpfs", scope, tools)

    assert str(planted) not in frozen
    digest = "sha256:" + hashlib.sha256(b"planted\n").hexdigest()
    ids = f"{os.getuid()}:{os.getgid()}"
    assert now[str(planted)] == f"f 640 {ids} {digest}"
    assert frozen[str(shm)].startswith("d ")
    assert frozen[str(shm / "sock")].endswith(" -> /run/x")
    # The collector's own session's file, and what is below it, are left out; another's is not.
    assert str(session_dir) not in now and f"{session_dir}/below" not in now
    assert str(shm / "session-999999") in now
    # A volatile file's contents are not compared; its entry is.
    assert frozen[str(moves)] == now[str(moves)] == f"f 644 {ids}"
    assert {k for k in now if now.get(k) != frozen.get(k)} == {str(planted)}


# --- mounts: Podman's by what its storage names -----------------------------------------------

LAYER = "a" * 64
CONTAINER = "c" * 64


def test_a_bind_mount_over_a_file_in_a_podman_layer_is_a_mount(tmp_path: Path) -> None:
    graph = tmp_path / "storage"
    (graph / "overlay-containers").mkdir(parents=True)
    (graph / "overlay-containers" / "containers.json").write_text(
        json.dumps([{"id": CONTAINER, "image": "b" * 64, "layer": LAYER, "metadata": "{}"}])
    )
    home, merged = f"{graph}/overlay", f"{graph}/overlay/{LAYER}/merged"
    shm = f"{graph}/overlay-containers/{CONTAINER}/userdata/shm"
    table = [
        "/ ext4 /dev/vda1 rw",
        f"{home} ext4 /dev/vda1[{home}] rw",
        f"{merged} overlay overlay rw",
        f"{shm} tmpfs shm rw",
    ]
    planted = f"{graph}/overlay/{LAYER}/diff/usr/bin/python3"
    tools = tmp_path / "tools"

    def mounts(lines: list[str]) -> dict[str, str]:
        (tmp_path / "table").write_text("\n".join(lines) + "\n")
        stand_in(tools, "findmnt", f"cat {shlex.quote(str(tmp_path / 'table'))}")
        return run_probe(
            "mount", FreezeScope(disk_excludes=(), podman_graph_root=str(graph)), tools
        )

    frozen = mounts(table)
    assert frozen == {"/": "ext4 /dev/vda1 rw"}  # Podman's three are named by its storage
    now = mounts([*table, f"{planted} ext4 /dev/vda1[/root/evil] rw,relatime"])
    assert now[planted] == "ext4 /dev/vda1[/root/evil] rw,relatime"
    # The storage home is Podman's only as a bind of itself; at another layer's path, not at all.
    other = f"{graph}/overlay/{'d' * 64}/merged"
    moved = mounts([table[0], f"{home} ext4 /dev/vda1[/root/evil] rw", f"{other} overlay o rw"])
    assert set(moved) == {"/", home, other}


# --- processes: no cgroup glob ---------------------------------------------------------------


def test_a_process_in_a_cgroup_the_old_scope_left_out_is_read(tmp_path: Path) -> None:
    """The old scope left out processes by the cgroup glob ``/user.slice/user-*.slice/user@*.
    service*``; the scope now has none, and the probe reads no cgroup: wherever a process runs,
    it is judged by its executable. (The old glob still applies to a manifest that has it.)"""
    scope = default_scope()
    assert not scope.process_cgroup_excludes and not scope.process_exe_excludes
    assert "/cgroup" not in probe("process").command(scope)
    old = FreezeScope(
        disk_excludes=(), process_cgroup_excludes=("/user.slice/user-*.slice/user@*.service*",)
    )
    assert "/cgroup" in probe("process").command(old)
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    copy = tmp_path / "in-user-manager"
    shutil.copy2(sleep, copy)
    # What /proc/<pid>/cgroup says cannot be chosen here; a glob matching this very process's
    # cgroup stands for the old excluded pattern.
    mine = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
    old_here = FreezeScope(disk_excludes=(), process_cgroup_excludes=(mine + "*",))
    child = subprocess.Popen([str(copy), "300"], start_new_session=True)
    try:
        assert str(copy) in run_probe("process", scope)
        assert str(copy) not in run_probe("process", old_here)  # what the glob hid
    finally:
        child.kill()
        child.wait()


def test_the_process_probe_leaves_out_its_own_tree_only(tmp_path: Path) -> None:
    """The collector's descendants are its own; a process started before it by anyone else,
    even in the same session, is read."""
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    before, own = tmp_path / "started-before", tmp_path / "own-child"
    for copy in (before, own):
        shutil.copy2(sleep, copy)
    command = probe("process").command(default_scope())
    # The probe starts once both children run their copies (not the shell's fork of them).
    running = " && ".join(
        f'[ "$(readlink /proc/${var}/exe)" = {shlex.quote(str(path))} ]'
        for var, path in (("b", before), ("o", own))
    )
    script = (
        f"{before} 300 & b=$!; {own} 300 & o=$!; until {running}; do sleep 0.01; done; "
        f"{command}; kill %1 %2"
    )
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {script}"], capture_output=True, text=True, timeout=60
    )
    seen = parse_lines(done.stdout)
    # Both are children of the collector's own shell: its tree. (Its ancestry up to the session
    # leader is left out too, pytest with it, so a process outside the tree is started below.)
    assert str(before) not in seen and str(own) not in seen
    outsider = subprocess.Popen([str(before), "300"], start_new_session=True)
    try:
        assert str(before) in run_probe("process", default_scope())
    finally:
        outsider.kill()
        outsider.wait()


def test_the_scheduling_probe_sees_a_renice_a_cpu_pin_and_a_lowered_limit(tmp_path: Path) -> None:
    """How a process is scheduled and bounded is inherited by all it starts: a renice, a CPU
    pin or a lowered resource limit of a long-running process changes its executable's value;
    the collector's own tree is left out as in the process probe."""
    if not shutil.which("taskset") or not shutil.which("renice"):
        pytest.skip("this machine has no taskset or renice")
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    copy = tmp_path / "long-running"
    shutil.copy2(sleep, copy)
    command = probe("scheduling").command(default_scope())
    child = subprocess.Popen([str(copy), "300"], start_new_session=True)
    try:
        frozen = run_probe("scheduling", default_scope())
        subprocess.run(["renice", "-n", "7", "-p", str(child.pid)], check=True, capture_output=True)
        reniced = run_probe("scheduling", default_scope())
        cpu = sorted(os.sched_getaffinity(child.pid))[0]
        os.sched_setaffinity(child.pid, {cpu})
        pinned = run_probe("scheduling", default_scope())
        soft, hard = resource.prlimit(child.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (64, hard))
        limited = run_probe("scheduling", default_scope())
    finally:
        child.kill()
        child.wait()
    cgroup = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((line[3:] for line in cgroup if line.startswith("0::")), "")
    assert frozen[str(copy)].startswith("nice 0 policy 0 rt 0 cpus ")
    assert reniced[str(copy)].startswith("nice 7 policy 0 rt 0 cpus ")
    assert pinned[str(copy)].startswith(f"nice 7 policy 0 rt 0 cpus {cpu} oom 0 cgroup {own} ")
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert f"open files={soft}/{hard_text}," in pinned[str(copy)]
    assert f"open files=64/{hard_text}," in limited[str(copy)]
    assert limited[str(copy)].replace("=64/", f"={soft}/") == pinned[str(copy)]
    own = tmp_path / "own-child"
    shutil.copy2(sleep, own)
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; nice -n 5 {own} 300 & {command}; kill %1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert str(own) not in parse_lines(done.stdout)


def wait_until_running(processes: list[subprocess.Popen[bytes]], executable: Path) -> None:
    """Until every process has exec'd ``executable`` (read from /proc), for at most 10 s."""
    deadline = time.monotonic() + 10
    while any(os.path.realpath(f"/proc/{p.pid}/exe") != str(executable) for p in processes):
        assert time.monotonic() < deadline, f"{executable} not running in 10 s"
        time.sleep(0.01)  # polling /proc, not waiting out the exec


def test_the_scheduling_probe_lists_each_distinct_setting_of_an_executable_once(
    tmp_path: Path,
) -> None:
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    copy = tmp_path / "workers"
    shutil.copy2(sleep, copy)
    children = [
        subprocess.Popen(["nice", "-n", str(n), str(copy), "300"], start_new_session=True)
        for n in (3, 0, 3)
    ]
    try:
        wait_until_running(children, copy)
        seen = run_probe("scheduling", default_scope())
    finally:
        for child in children:
            child.kill()
            child.wait()
    settings = seen[str(copy)].split("; ")
    assert [s.split(" cpus ")[0] for s in settings] == [
        "nice 0 policy 0 rt 0",
        "nice 3 policy 0 rt 0",
    ]


# --- /sys knobs ------------------------------------------------------------------------------


def test_the_sysfs_probe_sees_a_transparent_hugepage_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thp = tmp_path / "transparent_hugepage"
    (thp / "khugepaged").mkdir(parents=True)
    (thp / "enabled").write_text("always [madvise] never\n")
    (thp / "defrag").write_text("always defer [madvise] never\n")
    (thp / "khugepaged" / "full_scans").write_text("12\n")  # a counter: not a knob
    params = tmp_path / "module" / "zswap" / "parameters"
    params.mkdir(parents=True)
    (params / "enabled").write_text("N\n")
    (params / "secret").write_text("x\n")
    (params / "secret").chmod(0o200)
    monkeypatch.setattr(
        live,
        "SYS_KNOBS",
        (f"{thp}/{{enabled,defrag}}", f"{thp}/absent", f"{tmp_path}/module/*/parameters/*"),
    )
    swaps = tmp_path / "swaps"
    header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    swaps.write_text(header)
    monkeypatch.setattr(live, "SWAPS", str(swaps))
    scope = default_scope()
    frozen = run_probe("sysfs", scope)
    (thp / "enabled").write_text("[always] madvise never\n")
    swaps.write_text(header + "/swapfile\t\t\t\tfile\t\t1048572\t\t0\t\t-2\n")
    now = run_probe("sysfs", scope)
    swaps.write_text(header + "/swapfile\t\t\t\tfile\t\t1048572\t\t4096\t\t-2\n")
    used = run_probe("sysfs", scope)
    assert frozen[f"{thp}/enabled"] == "always [madvise] never"
    assert now[f"{thp}/enabled"] == "[always] madvise never"
    assert frozen[f"{thp}/defrag"] == now[f"{thp}/defrag"]
    # A swap area switched on is a knob; how much of it is used is not.
    assert now["swap:/swapfile"] == used["swap:/swapfile"] == "file priority -2"
    assert frozen[f"{params}/enabled"] == "N"
    assert set(frozen) == {f"{thp}/enabled", f"{thp}/defrag", f"{params}/enabled"} or (
        os.getuid() == 0 and f"{params}/secret" in frozen  # root reads a 0200 file
    )


# --- the speed probe, and freezes older than the categories -------------------------------------


def test_the_speed_probe_prints_two_figures() -> None:
    if not os.access(
        subprocess.run(
            ["findmnt", "-nvo", "SOURCE", "/"], capture_output=True, text=True
        ).stdout.strip()
        or "/nonexistent",
        os.R_OK,
    ):
        pytest.skip("the root device cannot be read here")
    done = subprocess.run(["bash", "-c", SPEED_COMMAND], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cpu, disk = live.parse_speed(done.stdout)
    assert 0 < cpu < 60 and 0 <= disk < 60


def speed_events(cpu: float, disk: float, live: float) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "event": "runner_on_ok",
            "event_data": {"task": OBSERVE_LIVE_TASK, "duration": live, "res": {}},
        }
    ]
    stdout = f"cpu\t{cpu}\ndisk\t{disk}\n"
    events.append(
        {"event": "runner_on_ok", "event_data": {"task": SPEED_TASK, "res": {"stdout": stdout}}}
    )
    return events


def frozen_with_speed() -> manifest.FreezeManifest:
    base = manifest_of({"slower_ratio": 3.0, "slower_min_seconds": 2.0}, COLLECTED)
    speed = SpeedFigures(cpu_seconds=1.5, disk_seconds=0.5, live_seconds=13.0)
    return base.model_copy(update={"state": base.state.model_copy(update={"speed": speed})})


def test_an_audit_far_slower_than_its_freeze_is_a_slower_drift() -> None:
    frozen = frozen_with_speed()
    checks, drifts = compare_speed(frozen, speed_events(2.9, 1.4, 13.0))
    assert checks == ["slower:cpu", "slower:disk", "slower:live"] and drifts == []
    # A CPU quota of 10%: the CPU 10x, the live reading 12x; the disk 3.6x but by 1.3 s only.
    _, drifts = compare_speed(frozen, speed_events(15.0, 1.8, 156.0))
    lines = {d.check: d.line for d in drifts}
    assert set(lines) == {"slower:cpu", "slower:live"}
    assert (
        lines["slower:cpu"] == "slower:cpu: expected <= 3x the frozen 1.50 s, found 15.00 s (10.0x)"
    )
    assert "(12.0x)" in lines["slower:live"]
    # No speed task in the events: said, not passed over.
    _, drifts = compare_speed(frozen, speed_events(1, 1, 1)[:-1])
    assert [d.check for d in drifts] == ["slower:cpu", "slower:disk"]
    # A freeze without figures (before #23) compares nothing.
    assert compare_speed(manifest_of({}, COLLECTED), speed_events(99, 99, 99)) == ([], [])


def test_the_playbook_runs_the_speed_probe_only_for_a_freeze_with_figures() -> None:
    [with_speed] = build_playbook(frozen_with_speed())
    [without] = build_playbook(manifest_of({}, COLLECTED))
    assert SPEED_TASK in [t["name"] for t in with_speed["tasks"]]
    assert SPEED_TASK not in [t["name"] for t in without["tasks"]]


def test_a_freeze_without_the_new_categories_is_named_not_compared_with_nothing() -> None:
    old = manifest_of({}, COLLECTED)  # recorded none of the late categories
    assert not {p.category for p in probes_for(old)} & LATE_CATEGORIES
    drifts = unrecorded(old)
    assert sorted(d.check for d in drifts) == sorted(f"{c}:(freeze)" for c in LATE_CATEGORIES)
    recorded = manifest_of({}, COLLECTED, live={c: {} for c in LATE_CATEGORIES})
    assert unrecorded(recorded) == []
    assert {p.category for p in probes_for(recorded)} >= LATE_CATEGORIES


def test_the_scope_file_names_identities_and_refuses_a_glob_exclusion() -> None:
    scope = default_scope()
    assert {e.applies_to for e in scope.exclusions.values()} >= {"process", "unit", "mount"}
    assert all(e.identity and e.reason for e in scope.exclusions.values())
    text = (Path(manifest.__file__).parent / "scope.toml").read_text()
    assert manifest.scope_of(text) == scope
    with pytest.raises(InputError, match="process_cgroup_excludes"):
        manifest.scope_of('process_cgroup_excludes = ["/x*"]\n' + text)


def test_an_old_manifest_loads_and_keeps_its_bytes() -> None:
    """The fields added by #23 are late: a manifest without them keeps its canonical JSON."""
    old = manifest_of({"process_cgroup_excludes": ["/user.slice/*"]}, COLLECTED)
    data = json.loads(old.model_dump_json())
    assert "speed" not in data["state"] and "exclusions" not in data["scope"]
    assert "ssh_session_executable" not in data["scope"]
    again = manifest.FreezeManifest.model_validate(data)
    assert again.sha256 == old.sha256 and again.state.speed is None
