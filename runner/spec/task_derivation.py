"""A task as the lab runs it: the upstream tree, the declared rules applied to it, and the list of
what they changed (the freeze manifest and the report print it per task).

The tree digest is Terminal-Bench's own (the bundle's NOTICE gives the reference tasks' values):
sha256 over ``path<TAB>sha256<TAB>size<LF>`` lines, one per file, sorted by path. Only files
count (git keeps no empty directories). Everything the lock does not name stays byte-identical:
``instruction.md``, ``tests/`` and ``solution/`` are never touched.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from pydantic import Field

from runner.core.models import FrozenModel, Sha256, Slug
from runner.spec.base_images import (
    BUILD,
    BaseImageUse,
    base_recipe,
    built_image_use,
    local_substitute_use,
    registry_image_use,
)
from runner.spec.lock import TaskSource, registry_image
from runner.spec.task_config import TaskSettings, read_task_settings

# task.toml's prebuilt image: one line of its [environment] table (Harbor's task format).
_DOCKER_IMAGE = re.compile(r'^docker_image\s*=\s*"(?P<image>[^"]*)"\s*\n', re.MULTILINE)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(?P<name>\S+)", re.MULTILINE | re.IGNORECASE)
# The files a rule may never change: what the agent reads, how it is judged, the reference answer.
UNTOUCHED = ("instruction.md", "tests/", "solution/")


class TaskDerivation(FrozenModel):
    """One task: its upstream tree, the tree the lab runs, and every change between them."""

    id: Slug
    upstream_tree: Sha256
    derived_tree: Sha256
    changes: tuple[str, ...] = Field(description="one line per change; empty: as upstream")
    settings: TaskSettings = Field(description="its task.toml, as the lab runs it")
    base_images: tuple[BaseImageUse, ...] = Field(
        description="each FROM name, the image the lab gives it, and how far apart they are"
    )

    @property
    def derived(self) -> bool:
        return bool(self.changes)


def tree_digest(root: Path) -> str:
    """Terminal-Bench's tree sha256 of the files under ``root``."""
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        data = path.read_bytes()
        relative = path.relative_to(root).as_posix()
        lines.append(f"{relative}\t{hashlib.sha256(data).hexdigest()}\t{len(data)}\n")
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def derive_task(
    upstream: Path, derived: Path, source: TaskSource, arch: str, suite: str
) -> TaskDerivation:
    """Copy ``upstream`` to ``derived`` (which must not exist) with the lock's rules applied;
    ``arch`` and ``suite`` are the guest's (its Debian is the local substitute's)."""
    shutil.copytree(upstream, derived, symlinks=True)
    uses = _base_image_uses(derived, source, suite)
    settings = read_task_settings(derived)
    changes = [*_prebuilt_image_dropped(derived, source, arch), *_base_images(uses)]
    if source.verifier is not None:
        changes.append(_verifier_line(source))
    if (multiplier := source.environment_build_timeout_multiplier) != 1:
        own = settings.build_timeout_sec
        changes.append(
            f"task.toml: build_timeout_sec {own:g} s is {source.build_timeout_sec(own):g} s here "
            f"(environment_build_timeout_multiplier {multiplier:g}, as Harbor's; the file is "
            "unchanged)"
        )
    return TaskDerivation(
        id=upstream.name,
        upstream_tree=tree_digest(upstream),
        derived_tree=tree_digest(derived),
        changes=tuple(changes),
        settings=settings,
        base_images=uses,
    )


def _prebuilt_image_dropped(task: Path, source: TaskSource, arch: str) -> list[str]:
    toml = task / "task.toml"
    if not source.build_from_environment or not toml.is_file():
        return []
    text = toml.read_text()
    found = _DOCKER_IMAGE.search(text)
    if found is None:
        return []
    toml.write_text(text[: found.start()] + text[found.end() :])
    return [
        f'task.toml: [environment] docker_image = "{found["image"]}" removed: the image is '
        f"built from environment/ for {arch} (build_from_environment)"
    ]


def _base_image_uses(task: Path, source: TaskSource, suite: str) -> tuple[BaseImageUse, ...]:
    """Each ``FROM`` name the lock maps to a lab image (the Dockerfile is not edited: the lab
    tags its image with the name)."""
    dockerfile = task / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return ()
    uses = []
    for name in dict.fromkeys(m["name"] for m in _FROM.finditer(dockerfile.read_text())):
        image = source.base_images.get(name)
        if image is None or image == name:
            continue
        recipe = base_recipe(name) if image == BUILD else None
        if recipe is not None:
            uses.append(built_image_use(name, recipe))
        elif registry_image(image) is not None:
            uses.append(registry_image_use(name, image))
        else:
            uses.append(local_substitute_use(name, image, suite))
    return tuple(uses)


def _base_images(uses: tuple[BaseImageUse, ...]) -> list[str]:
    return [
        f"environment/Dockerfile: FROM {use.from_name} is the lab's {use.image} ({use.kind}; "
        "the file is unchanged)"
        for use in uses
    ]


def _verifier_line(source: TaskSource) -> str:
    assert source.verifier is not None
    tools = source.verifier
    parts = [*(f"{deb} (deb)" for deb in tools.debs)]
    if tools.uv:
        parts.append(f"uv {tools.uv} in /root/.local/bin (wheel)")
    parts.extend(tools.wheels)
    return (
        "verifier: tests/test.sh runs unchanged; what it installs is frozen in the base image "
        f"or served by the lab's mirror: {', '.join(parts)}"
    )
