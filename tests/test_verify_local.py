"""The real audit (ansible-runner, check mode) against this machine over Ansible's local
connection: the guest collection script and the playbook's shell must agree on a clean state,
and the audit must name each planted drift. No VM needed; the paths are under tmp_path.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import venv
from importlib import resources
from pathlib import Path

import pytest

from runner.freeze.manifest import Collected, FreezeManifest, FreezeScope, GuestState
from runner.verify.audit import audit
from runner.verify.report import VerifyReport

# The host's dpkg set and sockets belong to whoever else uses the machine: judged elsewhere.
OURS = ("file:", "tree:", "venv:", "kernel:")


def collect(scope: FreezeScope) -> Collected:
    script = resources.files("runner").joinpath("guest/collect_state.py").read_bytes()
    result = subprocess.run(
        [sys.executable, "-", scope.model_dump_json()],
        input=script,
        capture_output=True,
        check=True,
    )
    return Collected.model_validate(json.loads(result.stdout))


def our_drifts(report: VerifyReport) -> list[str]:
    return [drift.line for drift in report.drifts if drift.check.startswith(OURS)]


@pytest.fixture
def guest_tree(tmp_path: Path) -> Path:
    root = tmp_path / "guest"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("tool v1\n")
    (root / "bin" / "tool-link").symlink_to("tool")
    (root / "opt" / "bench" / "__pycache__").mkdir(parents=True)
    (root / "opt" / "bench" / "a file.txt").write_text("a\n")
    (root / "opt" / "bench" / "link").symlink_to("a file.txt")
    (root / "opt" / "bench" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    venv.create(root / "venvs" / "harbor", with_pip=True)
    return root


def test_audit_passes_on_the_frozen_state_and_names_each_drift(
    guest_tree: Path, tmp_path: Path
) -> None:
    root = str(guest_tree)
    scope = FreezeScope(
        files=(f"{root}/bin/*",),
        trees=(f"{root}/opt", f"{root}/none"),
        tree_excludes=("__pycache__",),
        venv_roots=(f"{root}/venvs",),
        venv_search_depth=1,
    )
    manifest = FreezeManifest(
        lab="local",
        environment_fingerprint="sha256:" + "0" * 64,
        scope=scope,
        state=GuestState.of(collect(scope), scope),
    )
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    assert set(manifest.state.venvs) == {f"{root}/venvs/harbor"}

    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    clean = audit(manifest, host, tmp_path / "evidence")
    # ansible-runner left the process's handlers alone (its default replaces them for good).
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    assert our_drifts(clean) == []
    assert {check.partition(":")[0] for check in clean.checks} >= {
        "file",
        "tree",
        "venv",
        "dpkg",
        "kernel",
    }
    events = list(Path(clean.evidence).glob("artifacts/*/job_events/*.json"))
    assert events, "the job events are kept as evidence"

    (guest_tree / "bin" / "tool").write_text("tool v2\n")
    (guest_tree / "bin" / "new-tool").write_text("x\n")
    (guest_tree / "opt" / "bench" / "link").unlink()
    (guest_tree / "opt" / "bench" / "link").symlink_to("elsewhere")
    (guest_tree / "opt" / "bench" / "__pycache__" / "n.pyc").write_bytes(b"\1")  # excluded
    (guest_tree / "none").mkdir()
    (guest_tree / "none" / "f").write_text("")
    site = next((guest_tree / "venvs" / "harbor" / "lib").glob("python3*/site-packages"))
    (site / "fake-1.0.dist-info").mkdir()
    (site / "fake-1.0.dist-info" / "METADATA").write_text("Name: fake\nVersion: 1.0\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 18765))
        listener.listen()
        drifted = audit(manifest, host, tmp_path / "evidence")

    sha = {
        name: "sha256:" + hashlib.sha256(data).hexdigest()
        for name, data in {
            "v1": b"tool v1\n",
            "v2": b"tool v2\n",
            "x": b"x\n",
            "empty": b"",
        }.items()
    }
    assert sorted(our_drifts(drifted)) == sorted(
        [
            f"file:{root}/bin/new-tool: expected absent, found {sha['x']}",
            f"file:{root}/bin/tool: expected {sha['v1']}, found {sha['v2']}",
            f"tree:{root}/none/f: expected absent, found {sha['empty']}",
            f"tree:{root}/opt/bench/link: expected symlink:a file.txt, found symlink:elsewhere",
            f"venv:{root}/venvs/harbor:fake: expected absent, found fake==1.0",
        ]
    )
    assert "listen:tcp/18765: expected absent, found listening" in [
        drift.line for drift in drifted.drifts
    ]
    assert not drifted.passed and os.path.isfile(Path(drifted.evidence) / "report.json")
