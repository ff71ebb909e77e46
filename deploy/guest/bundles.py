"""What the host prepares for the guest and adds to the artifact store, as plain tar blobs.

The guest has no network and a slow CPU, so work that needs a registry client, many small files
or gunzip happens here: each harness's npm tree is installed offline from the frozen lockfile and
the stored tarballs (for the guest's os/cpu/libc, no install scripts; see ``_install_frozen``), the
runtimes' npm tarballs are unzipped, and the task dirs and the runner package are packed. Each
bundle is an uncompressed tar (the guest unpacks it straight from the 9p share) with fixed
owners, modes and times, added to the store by its sha256. A bundle built from stored inputs is
built once: ``bundles/<inputs digest>`` in the cache remembers its blob.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.spec.platform import GuestPlatform
from runner.spec.resolution import TARBALLS_DIR, HarnessTree, PinnedArtifact, Resolution

# Bump when a bundle's recipe changes, so cached bundles are not taken for the new recipe.
BUNDLE_RECIPE = 2
_SKIPPED = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


def _tar_info(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Owner root, times fixed, permissions kept only as 'executable or not'."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if info.isdir() or info.mode & 0o111:
        info.mode = 0o755
    elif not info.issym():
        info.mode = 0o644
    return info


def _walk(root: Path) -> Iterable[Path]:
    """Every entry under ``root`` in sorted order, caches of Python tools left out."""
    for entry in sorted(root.iterdir()):
        if entry.name in _SKIPPED:
            continue
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)


def pack_directory(store: ArtifactStore, source: Path, arcname: str) -> str:
    """A deterministic tar of ``source`` (as ``arcname``/...) in the store; its digest."""
    temp = store.temp_path(f"{arcname.replace('/', '-')}.tar")
    try:
        with tarfile.open(temp, "w", format=tarfile.GNU_FORMAT) as archive:
            archive.add(source, arcname=arcname, recursive=False, filter=_tar_info)
            for entry in _walk(source):
                name = f"{arcname}/{entry.relative_to(source).as_posix()}"
                archive.add(entry, arcname=name, recursive=False, filter=_tar_info)
        return store.add_file(temp)
    finally:
        temp.unlink(missing_ok=True)


def _cached_bundle(store: ArtifactStore, paths: CachePaths, key: str) -> str | None:
    index = paths.bundle_index(key)
    if not index.is_file():
        return None
    digest = index.read_text().strip()
    return digest if store.has(digest) else None


def _remember_bundle(paths: CachePaths, key: str, digest: str) -> None:
    index = paths.bundle_index(key)
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(digest + "\n")


def runtime_bundle(store: ArtifactStore, paths: CachePaths, artifact: PinnedArtifact) -> str:
    """A runtime's npm tarball (``package/bin/node``) as an uncompressed tar of its ``bin/`` and
    top-level files, without the ``package/`` level: under TCG, gunzip of Node's 50 MB took the
    guest minutes."""
    key = sha256_digest(canonical_json({"recipe": BUNDLE_RECIPE, "runtime": artifact.sha256}))
    cached = _cached_bundle(store, paths, key)
    if cached is not None:
        return cached
    temp = store.temp_path(f"{artifact.filename}.tar")
    try:
        with (
            tarfile.open(store.blob(artifact.sha256), "r:gz") as source,
            tarfile.open(temp, "w", format=tarfile.GNU_FORMAT) as target,
        ):
            for member in source:
                if member.name.rstrip("/") in ("package", ""):
                    continue
                if not member.name.startswith("package/"):
                    raise RunnerError(f"{artifact.filename}: {member.name} is outside package/")
                member.name = member.name.removeprefix("package/")
                if "/" in member.name and not member.name.startswith("bin/"):
                    continue  # Node's C headers and man pages: nothing runs them
                content = source.extractfile(member) if member.isfile() else None
                target.addfile(_tar_info(member), content)
        digest = store.add_file(temp)
    finally:
        temp.unlink(missing_ok=True)
    _remember_bundle(paths, key, digest)
    return digest


def harness_tree_bundle(
    store: ArtifactStore, paths: CachePaths, resolution: Resolution, tree: HarnessTree
) -> str:
    """The harness's installed npm tree (``node_modules/``) for the guest, as a stored tar."""
    artifacts = [a for a in resolution.artifacts if tree.harness in a.harnesses]
    key = sha256_digest(
        canonical_json(
            {
                "recipe": BUNDLE_RECIPE,
                "lockfile": tree.lockfile,
                "arch": resolution.arch,
                "npm": resolution.tools.npm,
                **({"overrides": tree.overrides} if tree.overrides else {}),
            }
        )
    )
    cached = _cached_bundle(store, paths, key)
    if cached is not None:
        return cached
    platform = GuestPlatform(resolution.arch)
    with tempfile.TemporaryDirectory(prefix=f"harness-{tree.harness}-") as workdir:
        work = Path(workdir)
        project, npm_cache, links = work / "tree", work / "npm-cache", work / "links"
        for directory in (project / TARBALLS_DIR, links):
            directory.mkdir(parents=True)
        lockfile = json.loads(store.blob(tree.lockfile).read_bytes())
        (project / "package.json").write_text(json.dumps(tree.package_json(lockfile)))
        (project / "package-lock.json").write_text(json.dumps(lockfile))
        registry_tarballs = []
        for artifact in artifacts:
            blob = store.blob(artifact.sha256)
            if artifact.is_pinned_tarball:
                shutil.copyfile(blob, project / TARBALLS_DIR / artifact.filename)
            else:
                # npm takes a local tarball for its cache only by a .tgz name.
                link = links / f"{artifact.sha256.removeprefix('sha256:')}.tgz"
                link.symlink_to(blob)
                registry_tarballs.append(str(link))
        if registry_tarballs:
            _npm(["cache", "add", "--cache", str(npm_cache), *registry_tarballs], project, tree)
        _install_frozen(project, npm_cache, lockfile, platform, tree)
        digest = pack_directory(store, project / "node_modules", "node_modules")
    _remember_bundle(paths, key, digest)
    return digest


def _install_frozen(
    project: Path,
    npm_cache: Path,
    lockfile: dict[str, Any],
    platform: GuestPlatform,
    tree: HarnessTree,
) -> None:
    """npm's install of the frozen lockfile, offline, then ``npm ci``'s own check done here.

    Not ``npm ci``: since npm 11.16 it rejects a lockfile npm itself just wrote when a package
    lists an optional dependency the registry does not have (``Missing: <name>@ from lock
    file``; npm/cli#9846). ``npm install --package-lock-only`` leaves such a package out of the
    lockfile (OMP's pi-natives for darwin, win32 and linux-arm64: only -linux-x64 is published),
    and ci's ideal tree still holds it as an inert failed node, which its check counts as
    missing. ``npm install --no-save`` builds the same tree from the same lockfile and skips
    the inert node; what ci would have refused is refused here: a lockfile npm rewrote, or an
    installed package that is not the lockfile's (npm's record of what it installed,
    ``node_modules/.package-lock.json``, against the frozen entries).
    """
    written = (project / "package-lock.json").read_bytes()
    _npm(
        [
            "install", "--no-save", "--offline", "--ignore-scripts", "--no-audit", "--no-fund",
            "--cache", str(npm_cache), f"--os={platform.npm_os}",
            f"--cpu={platform.npm_cpu}", f"--libc={platform.npm_libc}",
        ],
        project,
        tree,
    )  # fmt: skip
    if (project / "package-lock.json").read_bytes() != written:
        raise RunnerError(f"harness {tree.harness}: npm changed the frozen package-lock.json")
    record = project / "node_modules" / ".package-lock.json"
    installed = json.loads(record.read_text())["packages"] if record.is_file() else {}
    locked = lockfile["packages"]
    wrong = [
        f"{key.removeprefix('node_modules/')}@{entry.get('version', '')}"
        for key, entry in installed.items()
        if key not in locked
        or any(entry[field] != locked[key].get(field) for field in _KEPT if field in entry)
    ]
    if wrong or not installed:
        raise RunnerError(
            f"harness {tree.harness}: npm installed what the frozen lockfile does not hold: "
            + (", ".join(sorted(wrong)) or "nothing at all")
        )


# The fields of a lockfile entry that say which bytes were installed.
_KEPT = ("version", "resolved", "integrity")


def _npm(args: list[str], cwd: Path, tree: HarnessTree) -> None:
    env = {**os.environ, "npm_config_update_notifier": "false"}
    result = subprocess.run(
        ["npm", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        raise RunnerError(
            f"harness {tree.harness}: npm {args[0]} failed: "
            f"{(errors or result.stderr.splitlines() or ['no output'])[0]}"
        )


# What uv's installer writes as $HOME/.local/bin/env (tests/test.sh sources it): put uv's
# directory first on PATH unless it is there already.
_UV_ENV = """#!/bin/sh
case ":${PATH}:" in
    *:"$HOME/.local/bin":*) ;;
    *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
"""


def verifier_bundle(store: ArtifactStore, uv_wheel: PinnedArtifact | None, mirror_url: str) -> str:
    """The files the tasks' local base image gets for their verifiers, as a tar of a root tree:
    uv's binaries from its wheel where its installer puts them (``root/.local/bin``, with the
    ``env`` file it writes), uv's system config (the lab's mirror as its only index, no Python
    downloads) and apt's source (the lab's mirror, the frozen Debian packages)."""
    files: dict[str, tuple[bytes, int]] = {
        "etc/apt/sources.list.d/bench-mirror.list": (
            f"deb [trusted=yes] {mirror_url}/debian ./\n".encode(),
            0o644,
        ),
        "etc/uv/uv.toml": (
            f'python-downloads = "never"\n\n[[index]]\nurl = "{mirror_url}/simple"\n'
            "default = true\n".encode(),
            0o644,
        ),
    }
    if uv_wheel is not None:
        files["root/.local/bin/env"] = (_UV_ENV.encode(), 0o644)
        with zipfile.ZipFile(store.blob(uv_wheel.sha256)) as wheel:
            for member in wheel.namelist():
                if member.endswith(("/scripts/uv", "/scripts/uvx")):
                    files[f"root/.local/bin/{member.rsplit('/', 1)[1]}"] = (
                        wheel.read(member),
                        0o755,
                    )
    temp = store.temp_path("verifier-root.tar")
    try:
        with tarfile.open(temp, "w", format=tarfile.GNU_FORMAT) as archive:
            for directory in sorted(_parents(files)):
                info = tarfile.TarInfo(directory)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            for name, (data, mode) in sorted(files.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                archive.addfile(info, io.BytesIO(data))
        return store.add_file(temp)
    finally:
        temp.unlink(missing_ok=True)


def _parents(files: dict[str, tuple[bytes, int]]) -> set[str]:
    return {str(parent) for name in files for parent in Path(name).parents if str(parent) != "."}
