"""The guest's provisioning played against recorders: which operations it calls, with what."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from deploy.guest import operations as guest_ops
from deploy.guest import plan, provision
from deploy.guest.plan import Bundle, GuestPlan, RegistryBaseImage, TaskImage, WarmCache

Calls = list[tuple[str, dict[str, Any]]]


def example_plan() -> GuestPlan:
    """A guest plan of two tasks, two harnesses (one warm), two local base images and a registry
    one; every digest distinct."""
    tasks = tuple(
        Bundle(f"task-{t}", f"sha256:t{t}", f"/opt/bench/tasks/{t}", "task.toml", 1) for t in "ab"
    )
    return GuestPlan(
        debs=(guest_ops.DebFile("podman", "5.4", "/srv/artifacts/sha256/p"),),
        runtimes=(
            Bundle("node", "sha256:n", "/opt/bench/node", "bin/node"),
            Bundle("bun", "sha256:b", "/opt/bench/bun", "bin/bun"),
        ),
        container_runtimes=(
            Bundle("node-container", "sha256:n", "/bench/artifacts/runtimes/node-1", "bin/node"),
            Bundle("bun-container", "sha256:b", "/bench/artifacts/runtimes/bun-1", "bin/bun"),
        ),
        harness_trees=tuple(
            Bundle(f"harness-{h}", f"sha256:h{h}", f"/opt/bench/harnesses/{h}", "node_modules")
            for h in ("pi", "omp")
        ),
        harbor_requirement="harbor==0.20.0",
        wheels=(("harbor-0.20.0-py3-none-any.whl", "/srv/artifacts/sha256/w"),),
        wheels_digest="sha256:w",
        runner_package=Bundle("runner-package", "sha256:r", "/opt/bench/python", "runner/x.py"),
        tasks=tasks,
        verifier=Bundle("verifier-root", "sha256:v", "/opt/bench/verifier-root", "etc/uv/uv.toml"),
        base_images={"localhost/base:1": ("debian",), "localhost/py:1": ("python", "py")},
        registry_images=(
            RegistryBaseImage(
                f"127.0.0.1:5000/bench/tiny@sha256:{'1' * 64}",
                f"sha256:{'1' * 64}",
                "c" * 64,
                "/srv/artifacts/sha256/o",
                ("tiny", "tiny-too"),
            ),
        ),
        image_inputs="sha256:i",
        rootfs_tar=plan._rootfs_tar("aarch64", "/opt/bench/verifier-root"),
        task_images=tuple(
            TaskImage(
                task.unit.removeprefix("task-"),
                f"bench-task-{task.unit}",
                f"{task.dest}/environment",
                f"sha256:x{task.unit}",
                600.0,
            )
            for task in tasks
        ),
        warm_caches=(WarmCache("pi", "bench-task-task-a", "pi --help", "sha256:wpi"),),
        mirror=guest_ops.Mirror("vmtest", "/repo/locks/demo.resolved.json"),
        debian_mirror="http://deb.debian.org/debian",
    )


class _Recorded:
    """Stands in for an operations module: each operation called is recorded, not run."""

    def __init__(self, module: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self._module, self._calls = module, calls

    def __getattr__(self, operation: str) -> Any:
        def record(**kwargs: Any) -> SimpleNamespace:
            self._calls.append((f"{self._module}.{operation}", kwargs))
            return SimpleNamespace(did_change=lambda: False)

        return record


def record_provisioning(monkeypatch: pytest.MonkeyPatch, plan: GuestPlan) -> Calls:
    """Run ``guest_provisioning`` on ``plan`` with every operation recorded, in call order, as
    ("module.operation", keyword arguments); no host, no pyinfra state."""
    calls: Calls = []
    for module in ("guest", "files", "server", "systemd"):
        monkeypatch.setattr(provision, module, _Recorded(module, calls))
    provision.guest_provisioning._inner(plan)  # type: ignore[attr-defined]
    return calls
