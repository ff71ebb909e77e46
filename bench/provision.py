"""Guest provisioning timings: per step (cold), transfer MB/s, and pyinfra vs Ansible re-provision.

    python bench/provision.py [--lab guest] [--cold] [--repeats 3]

--cold tears the lab down first and times every step of a full deploy (VM and guest) from the
live pyinfra output. Then, on the provisioned guest: the artifact store's read rate through the
9p share (guest page cache dropped first) against a tar stream over SSH, and the re-provision
of an unchanged guest, ``pyinfra --limit lab_guests`` against an Ansible playbook making the
same checks through ansible-runner (``--check``). Targets: share >= 50 MB/s; pyinfra >= 3x
faster than Ansible.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from deploy.guest.plan import GuestPlan, plan_guest
from deploy.guest.provision import FSTAB_OPTIONS
from runner.cache.paths import CachePaths
from runner.lab.layout import AGENT_USER, ARTIFACTS_MOUNT_TAG, GUEST
from runner.lab.state import REPO_ROOT, LabPaths, LabState, load_lab_state
from runner.lab.transport import SshTransport
from runner.spec.lock import load_lock
from runner.verify.audit import ssh_host_vars

SHARE_TARGET_MB_S = 50.0
SPEEDUP_TARGET = 3.0
_OPERATION = re.compile(r"^--> Starting operation: (.+?)\s*$")


def deploy_argv(*limit: str) -> list[str]:
    return ["pyinfra", "-y", "inventory/local.py", "deploy.py", *limit]


def timed_steps(argv: list[str], lab: str) -> tuple[float, list[tuple[str, float]]]:
    """Wall seconds of a deploy and of each operation (from one start line to the next)."""
    started = time.monotonic()
    steps: list[tuple[str, float]] = []
    with subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env={**os.environ, "LAB": lab},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # pyinfra writes its progress to stderr
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            match = _OPERATION.match(line)
            if match:
                steps.append((match[1], time.monotonic()))
    if process.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({process.returncode})")
    ended = time.monotonic()
    ends = [at for _, at in steps[1:]] + [ended]
    return ended - started, [(name, end - at) for (name, at), end in zip(steps, ends, strict=True)]


def share_rate(guest: SshTransport, digest: str) -> tuple[float, float]:
    """MB/s of one stored blob into the guest: read through the 9p share (guest page cache
    dropped first), and streamed from the host over an SSH channel (the transport's upload)."""
    blob = GUEST.blob(digest)
    guest.check("sync; echo 3 > /proc/sys/vm/drop_caches")
    result = guest.check(f"dd if={blob} of=/dev/null bs=1M 2>&1 | tail -1")
    match = re.search(r"([\d.]+) s, ", result.stdout)
    data = CachePaths.default().blob(digest.removeprefix("sha256:")).read_bytes()
    over_9p = len(data) / float(match[1]) / 1e6 if match else float("nan")
    started = time.monotonic()
    guest.check_stdin("cat > /dev/null", data)
    over_ssh = len(data) / (time.monotonic() - started) / 1e6
    return over_9p, over_ssh


def _task(name: str, module: str, args: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": name, module: args, **more}


def _command(name: str, command: str, expect: str) -> list[dict[str, Any]]:
    """A shell read of the guest and an assertion on what it printed (never a change)."""
    register = re.sub(r"\W+", "_", name).strip("_").lower()
    return [
        _task(name, "ansible.builtin.shell", {"cmd": command},
              register=register, changed_when=False, check_mode=False),
        _task(f"{name}: as wanted", "ansible.builtin.assert",
              {"that": [f"{register}.stdout | trim == {json.dumps(expect)}"], "quiet": True}),
    ]  # fmt: skip


def same_checks_playbook(plan: GuestPlan) -> list[dict[str, Any]]:
    """What the warm pyinfra deploy reads, as Ansible tasks run with --check."""
    mount = str(GUEST.artifacts_mount)
    tasks: list[dict[str, Any]] = [
        _task("Mount point", "ansible.builtin.file", {"path": mount, "state": "directory"}),
        _task("fstab", "ansible.builtin.lineinfile",
              {"path": "/etc/fstab", "regexp": f"^{ARTIFACTS_MOUNT_TAG} ",
               "line": f"{ARTIFACTS_MOUNT_TAG} {mount} 9p {FSTAB_OPTIONS} 0 0"}),
        *_command("Share mounted", f"findmnt -n -o FSTYPE {mount}", "9p"),
        *_command(  # dpkg-query lists packages sorted by name
            "Debian packages",
            "dpkg-query -W -f '${Version} ' " + " ".join(deb.name for deb in plan.debs),
            " ".join(deb.version for deb in sorted(plan.debs, key=lambda deb: deb.name)),
        ),
        _task("nodocker", "ansible.builtin.copy",
              {"dest": "/etc/containers/nodocker", "content": "", "force": False}),
        _task("podman.socket", "ansible.builtin.systemd_service",
              {"name": "podman.socket", "state": "started", "enabled": True}),
        _task("Agent user", "ansible.builtin.user",
              {"name": AGENT_USER, "shell": "/bin/bash", "create_home": True}),
    ]  # fmt: skip
    units = [
        *plan.runtimes,
        *plan.container_runtimes,
        *plan.harness_trees,
        plan.runner_package,
        *plan.tasks,
    ]
    for unit in units:
        tasks += _command(f"Unit {unit.unit}", f"cat {GUEST.unit_stamp(unit.unit)}", unit.digest)
    tasks += _command("Unit harbor-venv", f"cat {GUEST.unit_stamp('harbor-venv')}",
                      plan.wheels_digest)  # fmt: skip
    tasks.append(
        _task("Runner on the venv's path", "ansible.builtin.copy",
              {"dest": str(GUEST.site_packages / "bench-runner.pth"),
               "content": f"{GUEST.python_path}\n"})
    )  # fmt: skip
    tasks.append(_task("Trial dirs", "ansible.builtin.file",
                       {"path": str(GUEST.trials_dir), "state": "directory"}))  # fmt: skip
    for image in plan.base_images:
        tasks += _command(
            f"Image {image}",
            f"podman image inspect --format '{{{{index .Labels \"bench.inputs\"}}}}' {image}",
            plan.image_inputs,
        )
    return [{"hosts": "all", "gather_facts": False, "tasks": tasks}]


def ansible_reprovision(lab: LabState, plan: GuestPlan) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="ansible-provision-") as private:
        root = Path(private)
        (root / "project").mkdir()
        (root / "inventory").mkdir()
        (root / "project" / "provision.yml").write_text(yaml.safe_dump(same_checks_playbook(plan)))
        # As the audit reaches the guest: strict against the lab's pinned host key.
        inventory = {"all": {"hosts": {"guest": ssh_host_vars(lab)}}}
        (root / "inventory" / "hosts.json").write_text(json.dumps(inventory))
        started = time.monotonic()
        result = ansible_runner.run(
            private_data_dir=private, playbook="provision.yml", cmdline="--check", quiet=True
        )
        seconds = time.monotonic() - started
        changed = sum(
            1
            for event in result.events
            if event.get("event") == "runner_on_ok" and event["event_data"]["res"].get("changed")
        )
        return seconds, f"{result.status}, {changed} would change"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="guest")
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    lab = arguments.lab
    if arguments.cold:
        subprocess.run(["runner", "teardown", "--lab", lab], cwd=REPO_ROOT, check=True)
        seconds, steps = timed_steps(deploy_argv(), lab)
        print(f"cold deploy (VM and guest), wall: {seconds:.1f} s")
        for name, step_seconds in steps:
            print(f"  {step_seconds:7.1f} s  {name}")

    state = load_lab_state(LabPaths.for_lab(lab))
    lock_path = Path(os.environ.get("LOCK", "locks/demo.toml"))
    plan = plan_guest(load_lock(REPO_ROOT / lock_path), REPO_ROOT / lock_path, lab)
    with SshTransport.for_lab(state).connect(60) as guest:
        node = plan.runtimes[0]
        over_9p, over_ssh = share_rate(guest, node.digest)
    print(f"read of {node.unit}'s tarball in the guest: 9p share {over_9p:.1f} MB/s "
          f"(target >= {SHARE_TARGET_MB_S:.0f}), SSH stream {over_ssh:.1f} MB/s")  # fmt: skip

    pyinfra_runs = []
    for _ in range(arguments.repeats):
        seconds, steps = timed_steps(deploy_argv("--limit", "lab_guests"), lab)
        pyinfra_runs.append(seconds)
    ansible_runs = [ansible_reprovision(state, plan) for _ in range(arguments.repeats)]
    best_pyinfra = min(pyinfra_runs)
    best_ansible = min(seconds for seconds, _ in ansible_runs)
    print(f"re-provision, unchanged guest ({len(steps)} operations), best of "
          f"{arguments.repeats}:")  # fmt: skip
    print(
        f"  pyinfra  {best_pyinfra:6.1f} s  (runs: {', '.join(f'{s:.1f}' for s in pyinfra_runs)})"
    )
    print(f"  ansible  {best_ansible:6.1f} s  (runs: "
          f"{', '.join(f'{s:.1f}' for s, _ in ansible_runs)}; {ansible_runs[-1][1]})")  # fmt: skip
    speedup = best_ansible / best_pyinfra
    print(f"  pyinfra is {speedup:.1f}x faster (target >= {SPEEDUP_TARGET:.0f}x)")
    return 0 if speedup >= SPEEDUP_TARGET and over_9p >= SHARE_TARGET_MB_S else 1


if __name__ == "__main__":
    sys.exit(main())
