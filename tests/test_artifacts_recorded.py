"""A committed resolution is authoritative: against a loopback package index that gains a newer
dependency, ``runner resolve`` fetches the recorded wheel and leaves the file byte-identical;
``--update`` keeps it while the lock allows it and moves it when the lock's change needs it
moved; ``--update --upgrade`` takes the newer one, says so, and the environment fingerprint
moves, so a lab frozen for the old one is refused by ``runner execute``'s identity check.

Scope: the lock resolves its ``wheels`` section only (Harbor and its dependency from the
loopback index, via the lock's ``tools.python_index``). Debian is stubbed to a glibc version
(the wheels are pure Python, so it chooses nothing) and npm is not asked: those parts are not
what these tests are about, and the fast tier reaches no registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner.artifacts import resolver
from runner.artifacts.debian import DebianPlan
from runner.artifacts.plan import Plan
from runner.cache.paths import CachePaths
from runner.cache.store import CorruptArtifact
from runner.cli.resolve import fetch_resolution, update_resolution
from runner.core.errors import InputError, RunnerError
from runner.run.execute import check_identities
from runner.run.run_dir import open_run
from runner.spec.lock import load_lock
from runner.spec.resolution import Resolution

REPO = Path(__file__).resolve().parents[1]
WHEELS = frozenset({"wheels"})


class LoopbackIndex:
    """A PEP 691 (JSON) simple index on 127.0.0.1: projects -> version -> wheel bytes."""

    def __init__(self) -> None:
        self.projects: dict[str, dict[str, bytes]] = {}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.projects:
                    body = json.dumps(index.page(parts[1])).encode()
                    self._send(body, "application/vnd.pypi.simple.v1+json")
                elif parts[0] == "files" and len(parts) == 2 and index.file(parts[1]):
                    self._send(index.file(parts[1]) or b"", "application/octet-stream")
                else:
                    self.send_error(404)

            def _send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def publish(self, name: str, version: str, requires: str = "", extra: bytes = b"") -> None:
        self.projects.setdefault(name, {})[version] = _wheel(name, version, requires, extra)

    def page(self, name: str) -> dict[str, Any]:
        files = [
            {
                "filename": _filename(name, version),
                "url": f"../../files/{_filename(name, version)}",
                "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
            }
            for version, data in self.projects[name].items()
        ]
        versions = list(self.projects[name])
        return {"meta": {"api-version": "1.1"}, "name": name, "versions": versions, "files": files}

    def file(self, filename: str) -> bytes | None:
        name, version = filename.split("-")[:2]
        return self.projects.get(name, {}).get(version)


def _filename(name: str, version: str) -> str:
    return f"{name}-{version}-py3-none-any.whl"


def _wheel(name: str, version: str, requires: str, extra: bytes) -> bytes:
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", b"# " + extra + b"\n")
        wheel.writestr(f"{info}/METADATA", metadata)
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return buffer.getvalue()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackIndex]:
    async def no_debian(*_args: object) -> DebianPlan:
        return DebianPlan(Plan(), glibc_minor=41)  # trixie's glibc 2.41

    monkeypatch.setattr(resolver, "plan_debs", no_debian)
    served = LoopbackIndex()
    harbor = load_lock(REPO / "locks" / "demo.toml").tools.harbor
    served.publish("harbor", harbor, requires="platformdirs>=4")
    served.publish("platformdirs", "4.14.8")
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.fixture
def lock_path(index: LoopbackIndex, tmp_path: Path) -> Path:
    """The demo lock, renamed, its wheels from the loopback index."""
    text = (REPO / "locks" / "demo.toml").read_text().replace('name = "demo"', 'name = "loop"')
    path = tmp_path / "locks" / "loop.toml"
    path.parent.mkdir()
    path.write_text(text.replace("[tools]\n", f'[tools]\npython_index = "{index.url}"\n'))
    return path


def _cache(tmp_path: Path, name: str) -> CachePaths:
    return CachePaths(tmp_path / name)


def _resolution(lock_path: Path) -> Resolution:
    return Resolution.model_validate_json(lock_path.with_name("loop.resolved.json").read_bytes())


def _wheel_versions(resolution: Resolution) -> dict[str, str]:
    return {artifact.name: artifact.version for artifact in resolution.artifacts}


def test_recorded_wins_until_update(index: LoopbackIndex, lock_path: Path, tmp_path: Path) -> None:
    first = update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    assert "added wheel:platformdirs 4.14.8" in first
    resolved = lock_path.with_name("loop.resolved.json")
    recorded = resolved.read_bytes()
    old = _resolution(lock_path)
    index.publish("platformdirs", "4.14.9")

    # A fresh cache: the recorded wheel comes from the index, the newer one is not looked at.
    fetched = fetch_resolution(lock_path, _cache(tmp_path, "b"))
    assert "downloaded 2 artifacts" in fetched[0]
    assert fetched[1].endswith(
        f"no change (2 artifacts; environment {old.environment_fingerprint})"
    )
    assert resolved.read_bytes() == recorded
    platformdirs = next(a for a in old.artifacts if a.name == "platformdirs")
    assert _cache(tmp_path, "b").blob(platformdirs.sha256.removeprefix("sha256:")).is_file()

    # --update starts from the recorded pins: nothing in the lock asks for the newer one.
    kept = update_resolution(lock_path, _cache(tmp_path, "b"), WHEELS)
    assert "no change" in kept and resolved.read_bytes() == recorded

    updated = update_resolution(lock_path, _cache(tmp_path, "b"), WHEELS, upgrade=True)
    new = _resolution(lock_path)
    assert "wheel:platformdirs 4.14.8 -> 4.14.9" in updated
    assert _wheel_versions(new)["platformdirs"] == "4.14.9"
    assert new.environment_fingerprint != old.environment_fingerprint
    assert (
        updated[-1] == f"environment {old.environment_fingerprint} -> {new.environment_fingerprint}"
    )
    assert "no change" in update_resolution(lock_path, _cache(tmp_path, "b"), WHEELS)


@pytest.mark.parametrize(
    ("newer_harbor_requires", "platformdirs"),
    [("platformdirs>=4", "4.14.8"), ("platformdirs>=4.14.9", "4.14.9")],
)
def test_an_update_moves_a_kept_pin_only_when_the_locks_change_needs_it_moved(
    index: LoopbackIndex,
    lock_path: Path,
    tmp_path: Path,
    newer_harbor_requires: str,
    platformdirs: str,
) -> None:
    # The lock now asks for a newer Harbor; the newer platformdirs is taken only when that
    # Harbor needs it (the kept pin cannot hold: pip chooses afresh, and says what moved).
    update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    index.publish("platformdirs", "4.14.9")
    harbor = load_lock(lock_path).tools.harbor
    newer = harbor.rsplit(".", 1)[0] + "." + str(int(harbor.rsplit(".", 1)[1]) + 1)
    index.publish("harbor", newer, requires=newer_harbor_requires)
    lock_path.write_text(
        lock_path.read_text().replace(f'harbor = "{harbor}"', f'harbor = "{newer}"')
    )
    moved = update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    assert f"wheel:harbor {harbor} -> {newer}" in moved
    assert _wheel_versions(_resolution(lock_path))["platformdirs"] == platformdirs


def test_recorded_bytes_differing_on_the_index_fail_closed(
    index: LoopbackIndex, lock_path: Path, tmp_path: Path
) -> None:
    update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    recorded = lock_path.with_name("loop.resolved.json").read_bytes()
    index.publish("platformdirs", "4.14.8", extra=b"republished")
    with pytest.raises(
        CorruptArtifact, match=r"platformdirs-4\.14\.8-py3-none-any\.whl: sha256 is "
    ):
        fetch_resolution(lock_path, _cache(tmp_path, "b"))
    assert lock_path.with_name("loop.resolved.json").read_bytes() == recorded


def test_a_changed_lock_needs_update(index: LoopbackIndex, lock_path: Path, tmp_path: Path) -> None:
    with pytest.raises(
        RunnerError, match=r"no resolution for lock loop: run 'runner resolve --update "
    ):
        fetch_resolution(lock_path, _cache(tmp_path, "a"))
    update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    lock_path.write_text(lock_path.read_text().replace("memory_mib = 3072", "memory_mib = 4096"))
    with pytest.raises(RunnerError, match=rf"run 'runner resolve --update {lock_path}'$"):
        fetch_resolution(lock_path, _cache(tmp_path, "a"))


def test_execute_refuses_a_lab_frozen_before_a_dependency_moved(
    index: LoopbackIndex, lock_path: Path, tmp_path: Path
) -> None:
    update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS)
    old = _resolution(lock_path).environment_fingerprint
    lab = SimpleNamespace(lab="l", environment_fingerprint=old)
    manifest = SimpleNamespace(environment_fingerprint=old)
    check_identities(open_run(lock_path, tmp_path / "run-1"), lab, manifest)  # type: ignore[arg-type]
    index.publish("platformdirs", "4.14.9")
    update_resolution(lock_path, _cache(tmp_path, "a"), WHEELS, upgrade=True)
    run = open_run(lock_path, tmp_path / "run-2")
    assert (
        run.paths.resolution.read_bytes() == lock_path.with_name("loop.resolved.json").read_bytes()
    )
    with pytest.raises(InputError, match="was provisioned for environment"):
        check_identities(run, lab, manifest)  # type: ignore[arg-type]
    lab.environment_fingerprint = run.lock.environment_fingerprint
    with pytest.raises(InputError, match="was frozen for environment"):
        check_identities(run, lab, manifest)  # type: ignore[arg-type]
    # A resumed run keeps the resolution it started with.
    assert open_run(None, tmp_path / "run-1").lock.environment_fingerprint == old


def test_cli_refusal_is_one_line(lock_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from runner.cli.main import main; main()",
            "resolve",
            str(lock_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "runner resolve --update" in result.stderr


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--task", "regex-log"], "--task chooses which tasks --lab records: give it with --lab"),
        (["--check", "--lab", "tb20"], "--lab records into the resolution: give it without"),
        (["--lab", "tb20", "--task", "no-such-task"], "no task no-such-task in the lock's [tasks]"),
        (
            ["--update", "--lab", "tb20", "--task", "no-such-task"],
            "no task no-such-task in the lock's [tasks]",
        ),
        (["--upgrade"], "--upgrade chooses every pin afresh in an update: give it with --update"),
    ],
)
def test_a_task_to_record_is_one_of_the_locks_and_goes_with_a_lab(
    extra: list[str], said: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from runner.cli.main import main; main()", "resolve",
         str(Path(__file__).parents[1] / "locks/tb20.toml"), *extra],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and said in result.stderr
