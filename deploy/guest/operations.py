"""Operations on the lab guest: each reads facts and yields shell commands only for what differs.

A unit installed from the artifact store (a runtime, a harness tree, Harbor's venv, the tasks)
records the digest it was installed from in /var/lib/bench/units/<unit> as its last command;
``UnitStamp`` reads it back, so an interrupted install is redone, never taken for done.
"""

from __future__ import annotations

import atexit
import math
import shlex
import subprocess
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages

from deploy.errors import ControllerCommand
from deploy.guest.facts import ImageDigest, ImageLabel, UnitStamp
from runner.guest.task_images import TaskImageBuild
from runner.lab.layout import GUEST
from runner.lab.mirror import start_lab_mirror

Commands = Generator[StringCommand | ControllerCommand | str, None, None]


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _unit(unit: str, digest: str, installed: str, work: Iterable[str]) -> Commands:
    """``work`` unless ``installed`` exists and the unit's stamp says ``digest``; then the stamp."""
    if host.get_fact(UnitStamp, unit=unit, installed=installed) == digest:
        host.noop(f"{unit} already installed from {_short(digest)}")
        return
    yield from work
    stamp = GUEST.unit_stamp(unit)
    yield f"mkdir -p {_q(stamp.parent)} && printf '%s\\n' {_q(digest)} > {_q(stamp)}"


def _replace_dir(dest: str, fill: str) -> list[str]:
    """Fill ``<dest>.new`` (``$NEW`` in ``fill``), then swap it in: no half tree at ``dest``."""
    new = _q(f"{dest}.new")
    return [
        f"rm -rf {new} && mkdir -p {new}",
        fill.replace("$NEW", new),
        f"rm -rf {_q(dest)} && mv {new} {_q(dest)}",
    ]


@operation()
def unpacked(
    unit: str, blob: str, dest: str, digest: str, strip_components: int = 0, check: str = ""
) -> Commands:
    """
    ``dest`` holds exactly what the tar ``blob`` holds (gzip is detected by tar).

    + unit: name of the unit (its stamp file)
    + blob: the tar in the guest (in the 9p share)
    + dest: directory to fill; replaced whole when the digest differs
    + digest: the blob's digest, recorded when done
    + strip_components: leading path parts to drop (npm tarballs put everything in package/)
    + check: a path under ``dest`` that must exist afterwards (the binary that matters)
    """
    installed = f"{dest}/{check}" if check else dest
    extract = f"tar -x -f {_q(blob)} -C $NEW --no-same-owner --strip-components={strip_components}"
    verify = [f"test -e {_q(installed)}"] if check else []
    yield from _unit(unit, digest, installed, [*_replace_dir(dest, extract), *verify])


@dataclass(frozen=True)
class DebFile:
    name: str
    version: str
    path: str


@operation()
def debs_installed(debs: tuple[DebFile, ...]) -> Commands:
    """
    Each Debian package is installed at its version, from its file; the missing ones are given
    to one ``dpkg -i`` (dpkg orders their configuration; the set is closed over dependencies).

    + debs: the packages and their files in the guest
    """
    installed = host.get_fact(DebPackages)
    missing = [deb for deb in debs if deb.version not in installed.get(deb.name, [])]
    if not missing:
        host.noop(f"{len(debs)} Debian packages already installed at their versions")
        return
    paths = " ".join(_q(deb.path) for deb in missing)
    yield f"DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold {paths}"


@operation()
def harbor_venv(
    venv: str, requirement: str, wheels: tuple[tuple[str, str], ...], digest: str
) -> Commands:
    """
    A venv with ``requirement`` installed by pip from the stored wheels only (``--no-index``),
    without byte-compiling (under TCG that is most of pip's time). pip runs from Debian's pip
    wheel, so the venv is made without pip (ensurepip would install and compile it first).

    + venv: the venv directory
    + requirement: what pip installs (``harbor==X``)
    + wheels: (file name, path in the guest) of every wheel it may take
    + digest: of the wheel set, recorded when done
    """
    links = f"{venv}.wheels"
    link_all = " && ".join(f"ln -s {_q(path)} {_q(f'{links}/{name}')}" for name, path in wheels)
    install = (
        "pip_wheel=$(ls /usr/share/python-wheels/pip-*.whl) && "
        f'{_q(venv)}/bin/python "$pip_wheel/pip" install --quiet '
        f"--no-index --find-links {_q(links)} --no-compile --disable-pip-version-check "
        f"{_q(requirement)}"
    )
    yield from _unit(
        "harbor-venv",
        digest,
        f"{venv}/bin/harbor",
        [
            f"rm -rf {_q(venv)} {_q(links)} && mkdir -p {_q(links)}",
            link_all,
            f"python3 -m venv --without-pip {_q(venv)}",
            install,
            f"rm -rf {_q(links)}",
        ],
    )


@operation()
def base_image(image: str, aliases: tuple[str, ...], digest: str, rootfs_tar: str) -> Commands:
    """
    A local Podman image imported from a tar the guest makes of itself (no registry), labelled
    with the digest of its inputs, and tagged with each name a task's Dockerfile uses.

    + image: the image's name
    + aliases: further names for it (the tasks' ``FROM`` names)
    + digest: of the image's inputs; a different one rebuilds it
    + rootfs_tar: shell command writing the root filesystem tar to stdout
    """
    if host.get_fact(ImageLabel, image=image, label="bench.inputs") == digest:
        for alias in aliases:
            if host.get_fact(ImageLabel, image=alias, label="bench.inputs") != digest:
                break
        else:
            host.noop(f"image {image} already built from {_short(digest)}")
            return
    yield (
        f"{rootfs_tar} | podman import --quiet "
        f"--change {_q(f'LABEL bench.inputs={digest}')} - {_q(image)}"
    )
    for alias in aliases:
        yield f"podman tag {_q(image)} {_q(alias)}"


@operation()
def registry_image(archive: str, digest: str, image_id: str, names: tuple[str, ...]) -> Commands:
    """
    A registry image, pinned by its manifest digest, loaded offline from its OCI archive in the
    artifact store and tagged with each name a task's Dockerfile uses; then each name must give
    the pinned digest, or the deploy fails.

    + archive: the OCI archive in the guest (in the 9p share)
    + digest: the manifest digest the lock pins
    + image_id: Podman's ID of the image (its config digest), what the names are tagged to
    + names: the tasks' ``FROM`` names for it
    """
    if all(host.get_fact(ImageDigest, image=name) == digest for name in names):
        host.noop(f"image {', '.join(names)} already loaded at {_short(digest)}")
        return
    yield f"podman load --quiet --input {_q(archive)}"
    for name in names:
        yield f"podman tag {_q(image_id)} {_q(name)}"
    for name in names:
        said = f'{_q(f"{name}: loaded with digest ")}"$found"{_q(f", the lock pins {digest}")}'
        yield (
            f"found=$(podman image inspect --format {_q('{{.Digest}}')} {_q(name)}) && "
            f'test "$found" = {_q(digest)} || {{ echo {said} >&2; exit 1; }}'
        )


@dataclass(frozen=True)
class Mirror:
    """The lab's package mirror (runner.lab.mirror), started the first time a build needs it
    and stopped when pyinfra exits."""

    lab: str
    resolution_file: str


_MIRRORS: dict[Mirror, subprocess.Popen[bytes]] = {}


def _mirror_serving(mirror: Mirror) -> None:
    if mirror not in _MIRRORS:
        _MIRRORS[mirror] = start_lab_mirror(mirror.lab, Path(mirror.resolution_file))
        atexit.register(_MIRRORS[mirror].terminate)


@operation()
def task_image(
    task: str, image: str, context: str, digest: str, timeout_seconds: float, mirror: Mirror
) -> Commands:
    """
    A task's container image built from its Dockerfile on the local base images (no pulls),
    labelled with the digest of its inputs. Built here, it is frozen with the guest, and the
    build Harbor runs in every cell finds each of its steps in Podman's layer cache instead of
    running them again under emulation. What a build installs comes from the lab's package
    mirror (the frozen set only), which serves while pyinfra runs. A failed build does not stop
    the deploy here: its output and exit status are kept for ``task_images_built``, so every
    task's build is tried and all failures are named at once.

    + task: the task's id (its build log is <build_logs>/<task>.log)
    + image: the image's name
    + context: the task's environment/ directory in the guest
    + digest: of the task's files and the base image's inputs; a different one rebuilds it
    + timeout_seconds: the task's build_timeout_sec (task.toml), times the lock's multiplier
    + mirror: the lab's package mirror
    """
    if host.get_fact(ImageLabel, image=image, label="bench.inputs") == digest:
        host.noop(f"image {image} already built from {_short(digest)}")
        return
    yield ControllerCommand(_mirror_serving, (mirror,), {})
    log, failed = GUEST.build_logs / f"{task}.log", GUEST.build_logs / f"{task}.failed"
    yield f"mkdir -p {_q(GUEST.build_logs)} && rm -f {_q(failed)}"
    yield (
        f"timeout --kill-after=30 {math.ceil(timeout_seconds)} "
        f"podman build --pull=never --layers "
        f"--label {_q(f'bench.inputs={digest}')} -t {_q(image)} {_q(context)} "
        f"> {_q(log)} 2>&1 || echo $? > {_q(failed)}"
    )


@operation()
def task_images_built(images: tuple[TaskImageBuild, ...]) -> Commands:
    """
    Every task image is built with its inputs' label; otherwise the deploy stops here with a
    table of every task whose build failed and the failure's own line (runner.guest.build_report).
    A build the lock tolerates (tasks.needs_network) is named with its failure, and does not
    stop it.

    + images: each task image's build, handed to the report as its JSON
    """
    required = [build for build in images if not build.tolerated]
    if all(
        host.get_fact(ImageLabel, image=build.image, label="bench.inputs") == build.inputs_digest
        for build in required
    ):
        host.noop(f"all {len(required)} task images that must build already built")
        return
    builds = " ".join(_q(build.model_dump_json(exclude_defaults=True)) for build in images)
    yield (
        f"{_q(GUEST.harbor_venv / 'bin' / 'python')} -m runner.guest.build_report "
        f"{_q(GUEST.build_logs)} {builds}"
    )


# Warming loads every extension once under emulation: minutes, never an hour.
WARM_TIMEOUT_SECONDS = 900


@operation()
def compiled_cache_warmed(
    harness: str, image: str, script: str, dest: str, digest: str
) -> Commands:
    """
    A harness's compiled caches in ``dest/jiti``, made by its warm script run once, as root, in a
    task container that sees the frozen artifacts where a cell's does, with no network at all.

    + harness: the harness's id (its unit is compiled-<id>)
    + image: the task image to run in
    + script: runner.guest.agent_plan.warm_script for the harness
    + dest: the harness's compiled-cache dir in the guest
    + digest: of the harness tree and the script; a different one warms it again
    """
    warm = (
        f"mkdir -p $NEW/jiti && timeout --kill-after=30 {WARM_TIMEOUT_SECONDS} "
        f"podman run --rm --network none --entrypoint /bin/bash {GUEST.podman_volumes} "
        "-v $NEW:/warm "
        f"-e TMPDIR=/warm -w / {_q(image)} -c {_q(script)}"
    )
    yield from _unit(f"compiled-{harness}", digest, f"{dest}/jiti", _replace_dir(dest, warm))
