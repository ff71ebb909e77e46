"""A directory standing in for a task container's root, entered with unshare and chroot.

A task's environment is "built" by playing its Dockerfile (FROM, WORKDIR, COPY, RUN only) into
the directory; commands run there under ``chroot`` with the host's /usr and /etc bound
read-only, much as the guest's base image is its own /usr and /etc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runner.spec.lock import load_lock

REPO = Path(__file__).resolve().parent.parent.parent
TASKS = REPO / "tasks"
DEMO_LOCK = load_lock(REPO / "locks" / "demo.toml")

# Bind the host's system read-only into the stand-in root, then run bash there with a clean
# environment. unshare gives the binds their own mount namespace, so nothing leaks to the host.
_ENTER_ROOT = """
set -e
root=$1 workdir=$2 command=$3
shift 3  # the rest: NAME=VALUE pairs for the command's environment
for dir in usr etc; do
  mount --bind "/$dir" "$root/$dir"
  mount -o remount,bind,ro "$root/$dir"
done
mount --rbind /dev "$root/dev"
mount --rbind /proc "$root/proc"
exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
  LANG=C.UTF-8 "$@" /bin/bash -c "mkdir -p \\"\\$1\\" && cd \\"\\$1\\" && eval \\"\\$2\\"" \
  bash "$workdir" "$command"
"""

needs_chroot = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare to stand in for a container",
)


@dataclass
class StandInContainer:
    """A directory playing a task container's root, built from the task's Dockerfile."""

    root: Path
    workdir: str = "/"
    log: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, root: Path) -> StandInContainer:
        for name in ("usr", "etc", "dev", "proc", "root", "tmp", "logs/verifier", "logs/agent"):
            (root / name).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        return cls(root)

    def run(
        self, command: str, environment: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        assignments = [f"{name}={value}" for name, value in (environment or {}).items()]
        done = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--fork",
                "sh",
                "-c",
                _ENTER_ROOT,
                "sh",
                str(self.root),
                self.workdir,
                command,
                *assignments,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.log.append(f"$ {command}\n{done.stdout}{done.stderr}")
        return done

    def copy_in(self, source: Path, target: str) -> None:
        destination = self.root / target.lstrip("/")
        if source.is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)

    def play_dockerfile(self, environment: Path) -> None:
        for instruction, argument in dockerfile_instructions(environment / "Dockerfile"):
            if instruction == "FROM":
                assert argument in DEMO_LOCK.tasks.base_images, f"FROM {argument} is not mapped"
            elif instruction == "WORKDIR":
                self.workdir = argument
                (self.root / argument.lstrip("/")).mkdir(parents=True, exist_ok=True)
            elif instruction == "COPY":
                source, target = argument.split()
                self.copy_in(environment / source, target)
            elif instruction == "RUN":
                built = self.run(argument)
                assert built.returncode == 0, "\n".join(self.log)
            else:
                raise AssertionError(f"{instruction}: not an instruction the base image allows")

    def reward(self) -> str:
        return (self.root / "logs/verifier/reward.txt").read_text().strip()


def dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    instructions = [line.split(maxsplit=1) for line in lines if line and not line.startswith("#")]
    return [(word.upper(), rest) for word, rest in instructions]
