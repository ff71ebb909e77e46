"""The recording mirror (runner.artifacts.recording) on loopback, with real apt and real pip as
a task's build runs them: asked for a package outside the frozen set, the lab's mirror refuses
it and the build's own words name it; built once against the recording mirror, the package is
fetched from the upstream (a loopback stand-in for deb.debian.org and pypi.org), checked and
recorded under the task; merged into the resolution, it is then served offline, byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runner.artifacts.recording import carried_records, merge_recorded, read_record
from runner.artifacts.task_builds import Recorded, RecordingSources, recording_mirror
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.files import read_model, write_model
from runner.core.roots import CACHE_ENV
from runner.guest.build_report import missing_packages
from runner.lab.mirror import read_requests, running_mirror
from runner.spec.resolution import PinnedArtifact, Resolution, ResolverTools
from tests.support.upstream_standin import (
    DEB_POOL_PATH,
    DEB_VERSION,
    SOURCE_NAME,
    WHEEL_NAME,
    Upstream,
    built_wheel,
    upstream_standin,
)

TASK = "needs-extras"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def resolution_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    resolution = Resolution(
        lock_name="recording-test",
        lock_environment="sha256:" + "1" * 64,
        arch="aarch64",
        suite="trixie",
        tools=ResolverTools(apt="apt 3", npm="11", pip="pip 25"),
        artifacts=(),
        harness_trees=(),
    )
    path = tmp_path / "recording-test.resolved.json"
    write_model(path, resolution)
    return path


def apt_download(mirror: str, work: Path, package: str) -> subprocess.CompletedProcess[str]:
    """``apt-get update && apt-get download`` against ``mirror``, as a build's apt asks."""
    return apt_get(work, f"deb [trusted=yes] {mirror}/debian ./", f"apt-get download -q {package}")


def apt_get(work: Path, sources_line: str, command: str) -> subprocess.CompletedProcess[str]:
    """``apt-get update`` and ``command`` in ``work``/got with ``sources_line`` its only
    source, apt's state kept in ``work``."""
    root = work / "apt"
    for directory in ("lists/partial", "cache/archives/partial", "etc/apt.conf.d"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    (root / "sources.list").write_text(f"{sources_line}\n")
    settings = {
        "Dir::State": root, "Dir::State::Lists": root / "lists", "Dir::State::status":
        root / "status", "Dir::Cache": root / "cache", "Dir::Etc::SourceList":
        root / "sources.list", "Dir::Etc::SourceParts": root / "etc", "Dir::Etc::Parts":
        root / "etc/apt.conf.d", "APT::Sandbox::User": "root", "Acquire::Languages": "none",
    }  # fmt: skip
    (root / "apt.conf").write_text("".join(f'{k} "{v}";\n' for k, v in settings.items()))
    env = {**os.environ, "APT_CONFIG": str(root / "apt.conf")}
    (work / "got").mkdir(exist_ok=True)
    return subprocess.run(
        f"apt-get update -q && {command}", shell=True, cwd=work / "got",
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def pip_download(mirror: str, work: Path, requirement: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
         "--index-url", f"{mirror}/simple/", "-d", str(work / "got"), requirement],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@contextmanager
def recording_at(
    resolution: Path, upstream: Upstream, work: Path, packages: bytes | None = None,
    phase: str = "build",
) -> Iterator[tuple[str, Path, Path]]:  # fmt: skip
    """The recording mirror of ``phase`` on a free port, fetching from the stand-in upstream."""
    port = free_port()
    sources = RecordingSources(
        upstream.debian_mirror, upstream.packages if packages is None else packages,
        upstream.python_index, "trixie",
    )  # fmt: skip
    with recording_mirror(resolution, port, work, TASK, phase, sources) as (log, record):
        yield f"http://127.0.0.1:{port}", log, record


@contextmanager
def lab_mirror_at(resolution: Path, work: Path) -> Iterator[str]:
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with running_mirror(resolution, port, work / "lab-mirror.jsonl"):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("phase", ["build", "trial"])
def test_outside_the_frozen_set_named_then_recorded_then_served_offline_byte_identical(
    tmp_path: Path, resolution_file: Path, phase: str
) -> None:
    """A task's build and its trial (its oracle: solution and verifier) are recorded alike,
    each as its own kinds, and the lab's mirror then serves both offline."""
    frozen = tmp_path / "frozen"
    with lab_mirror_at(resolution_file, frozen) as mirror:
        apt, pip = (
            apt_download(mirror, frozen, "bench-extra"),
            pip_download(mirror, frozen, "bench-extra==2.0"),
        )
    assert apt.returncode != 0 and missing_packages(apt.stdout + apt.stderr) == ("bench-extra",)
    assert pip.returncode != 0 and missing_packages(pip.stderr) == ("bench-extra==2.0",)

    recording = tmp_path / "recording"
    with upstream_standin(tmp_path) as upstream:
        with recording_at(resolution_file, upstream, recording, phase=phase) as (
            mirror, log, record,
        ):  # fmt: skip
            apt = apt_download(mirror, recording, "bench-extra")
            pip = pip_download(mirror, recording, "bench-extra==2.0")
            upstream_asked = list(upstream.requests)
        deb, wheel = upstream.deb, upstream.wheel
    assert apt.returncode == 0, apt.stdout + apt.stderr
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert f"/debian/{DEB_POOL_PATH}" in upstream_asked and f"/files/{WHEEL_NAME}" in upstream_asked
    served, failed = read_record(record)
    assert failed == ()
    assert sorted((a.kind, a.name, a.version, a.tasks) for a in served) == [
        (f"{phase}-deb", "bench-extra", DEB_VERSION, (TASK,)),
        (f"{phase}-python", "bench-extra", "2.0", (TASK,)),
    ]
    requests, _ = read_requests(log, 0)
    assert {request.item for request in requests if request.upstream} == {
        f"deb:{DEB_POOL_PATH}",
        "pypi:bench-extra",
        f"wheel:{WHEEL_NAME}",
    }
    assert not any(request.miss for request in requests)

    merged = merge_recorded(read_model(resolution_file, Resolution), served, (TASK,))
    write_model(resolution_file, merged)
    offline = tmp_path / "offline"  # the upstream is gone: only the store serves now
    with lab_mirror_at(resolution_file, offline) as mirror:
        apt = apt_download(mirror, offline, "bench-extra")
        pip = pip_download(mirror, offline, "bench-extra==2.0")
    assert apt.returncode == 0, apt.stdout + apt.stderr
    assert pip.returncode == 0, pip.stdout + pip.stderr
    (got,) = (offline / "got").glob("bench-extra_*_all.deb")
    assert got.read_bytes() == deb
    assert (offline / "got" / WHEEL_NAME).read_bytes() == wheel


def test_a_project_the_frozen_set_has_at_another_version_is_recorded_at_the_one_asked_for(
    tmp_path: Path, resolution_file: Path
) -> None:
    """The frozen set has bench-extra 1.0 (as Harbor's requests); a trial pins 2.0: the
    recording offers both, records 2.0, and the lab's mirror then serves both offline."""
    frozen_wheel = built_wheel("1.0")
    digest = ArtifactStore(CachePaths.default()).add_bytes(frozen_wheel, "bench_extra-1.0.whl")
    held = PinnedArtifact.model_validate(
        {"kind": "wheel", "name": "bench-extra", "version": "1.0",
         "url": "https://pypi.example/bench_extra-1.0-py3-none-any.whl",
         "filename": "bench_extra-1.0-py3-none-any.whl", "sha256": digest,
         "size": len(frozen_wheel)}
    )  # fmt: skip
    # Merged as a recording is, so the fingerprint is the one its artifacts give.
    write_model(
        resolution_file, merge_recorded(read_model(resolution_file, Resolution), (held,), ())
    )
    with (
        upstream_standin(tmp_path) as upstream,
        recording_at(resolution_file, upstream, tmp_path / "rec", phase="trial") as recording,
    ):
        pip = pip_download(recording[0], tmp_path / "rec", "bench-extra==2.0")
    record = recording[2]
    assert pip.returncode == 0, pip.stdout + pip.stderr
    served, _ = read_record(record)
    assert [(a.kind, a.version) for a in served] == [("trial-python", "2.0")]
    write_model(
        resolution_file,
        merge_recorded(read_model(resolution_file, Resolution), served, (TASK,)),
    )
    with lab_mirror_at(resolution_file, tmp_path / "offline") as mirror:
        for version in ("1.0", "2.0"):
            got = pip_download(mirror, tmp_path / "offline", f"bench-extra=={version}")
            assert got.returncode == 0, got.stdout + got.stderr


def test_what_another_recording_took_is_recorded_again_under_this_task(
    tmp_path: Path, resolution_file: Path
) -> None:
    """A file another task's trial took is in the resolution; this task's recording is not
    served it from there: it is taken again and recorded under this task too, so replacing
    either recording later leaves the other its file."""
    wheel = built_wheel()
    digest = ArtifactStore(CachePaths.default()).add_bytes(wheel, WHEEL_NAME)
    other = PinnedArtifact.model_validate(
        {"kind": "trial-python", "name": "bench-extra", "version": "2.0",
         "url": f"https://pypi.example/{WHEEL_NAME}", "filename": WHEEL_NAME, "sha256": digest,
         "size": len(wheel), "tasks": ("other-task",)}
    )  # fmt: skip
    write_model(
        resolution_file, merge_recorded(read_model(resolution_file, Resolution), (other,), ())
    )
    with (
        upstream_standin(tmp_path) as upstream,
        recording_at(resolution_file, upstream, tmp_path / "rec", phase="trial") as recording,
    ):
        pip = pip_download(recording[0], tmp_path / "rec", "bench-extra==2.0")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    served, _ = read_record(recording[2])
    merged = merge_recorded(read_model(resolution_file, Resolution), served, (TASK,))
    (artifact,) = merged.artifacts
    assert (artifact.sha256, artifact.tasks) == (digest, tuple(sorted(("other-task", TASK))))


def test_a_source_package_of_a_suite_the_task_names_is_recorded_by_path_then_served_offline(
    tmp_path: Path, resolution_file: Path
) -> None:
    """`apt-get source` from a deb-src line naming the Debian mirror (its host reaches the lab's
    mirror): refused by the frozen set, recorded by archive path, then served offline."""
    fetch = f"apt-get source --download-only -q {SOURCE_NAME}"

    def deb_src(mirror: str) -> str:
        return f"deb-src [trusted=yes] {mirror}/debian stable main"

    with lab_mirror_at(resolution_file, tmp_path / "frozen") as mirror:
        refused = apt_get(tmp_path / "frozen", deb_src(mirror), fetch)
    assert refused.returncode != 0
    with upstream_standin(tmp_path) as upstream:
        with recording_at(resolution_file, upstream, tmp_path / "recording") as (
            mirror, _, record,
        ):  # fmt: skip
            recorded = apt_get(tmp_path / "recording", deb_src(mirror), fetch)
        sources = upstream.sources
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    served, failed = read_record(record)
    assert failed == ()
    assert {a.name: a.kind for a in served} == dict.fromkeys(sources, "build-debian-file")
    write_model(
        resolution_file, merge_recorded(read_model(resolution_file, Resolution), served, (TASK,))
    )
    offline = tmp_path / "offline"
    with lab_mirror_at(resolution_file, offline) as mirror:
        again = apt_get(offline, deb_src(mirror), fetch)
        other = apt_get(offline, deb_src(mirror), "apt-get source --download-only -q other-src")
    assert again.returncode == 0, again.stdout + again.stderr
    got = {path.name: path.read_bytes() for path in (offline / "got").iterdir()}
    pool = {path.rsplit("/", 1)[-1]: data for path, data in sources.items() if "pool/" in path}
    assert got == pool and len(pool) == 2  # the .dsc and its tarball, byte for byte
    assert other.returncode != 0 and "other-src" in other.stdout + other.stderr


def test_a_file_unlike_its_index_entry_is_refused_and_its_failure_recorded(
    tmp_path: Path, resolution_file: Path
) -> None:
    with upstream_standin(tmp_path) as upstream:
        lying = upstream.packages.split(b"SHA256: ")[0] + b"SHA256: " + b"0" * 64 + b"\n"
        with recording_at(resolution_file, upstream, tmp_path, lying) as (mirror, _, record):
            apt = apt_download(mirror, tmp_path, "bench-extra")
        deb_digest = "sha256:" + hashlib.sha256(upstream.deb).hexdigest()
    assert apt.returncode != 0
    served, failed = read_record(record)
    assert served == ()
    assert [failure.url.endswith(DEB_POOL_PATH) for failure in failed] == [True]
    assert "the index says sha256:" + "0" * 64 in failed[0].error
    assert not ArtifactStore(CachePaths.default()).has(deb_digest)


def artifact(kind: str, digit: str, tasks: tuple[str, ...]) -> PinnedArtifact:
    return PinnedArtifact.model_validate(
        {"kind": kind, "name": f"p{digit}", "version": "1", "url": f"https://x/{digit}",
         "filename": f"p{digit}.deb", "sha256": "sha256:" + digit * 64, "size": 1, "tasks": tasks}
    )  # fmt: skip


def test_merging_a_record_names_every_task_of_a_file_and_replaces_the_recorded_tasks(
    resolution_file: Path,
) -> None:
    before = read_model(resolution_file, Resolution).model_copy(
        update={"artifacts": (
            artifact("deb", "9", ()),
            artifact("build-deb", "1", ("a",)),
            artifact("build-deb", "2", ("a", "b")),
            artifact("build-deb", "3", ("b",)),
        )}
    )  # fmt: skip
    after = merge_recorded(before, (artifact("build-deb", "3", ("a",)),), ("a",))
    by_digit = {a.name: a.tasks for a in after.artifacts}
    # a was built again: its old files leave unless another task has them; 3 now names both
    assert by_digit == {"p9": (), "p2": ("b",), "p3": ("a", "b")}
    assert json.loads(after.model_dump_json())["artifacts"][0]["kind"] == "build-deb"


def test_a_recording_replaces_a_tasks_build_and_trial_and_a_fresh_resolution_keeps_both(
    resolution_file: Path,
) -> None:
    before = read_model(resolution_file, Resolution).model_copy(
        update={"artifacts": (
            artifact("build-deb", "1", ("a",)),
            artifact("trial-python", "2", ("a",)),
            artifact("trial-deb", "3", ("a", "gone")),
        )}
    )  # fmt: skip
    # a task's trials are recorded again with its build: what it took before is replaced
    after = merge_recorded(before, (artifact("trial-deb", "4", ("a",)),), ("a",))
    assert {(a.kind, a.name): a.tasks for a in after.artifacts} == {
        ("trial-deb", "p3"): ("gone",),
        ("trial-deb", "p4"): ("a",),
    }
    # recorded again and it took nothing beyond the frozen set: nothing of it is kept
    assert merge_recorded(before, (), ("a", "gone")).artifacts == ()
    kept = carried_records(before.artifacts, ("a",))
    assert [(a.kind, a.tasks) for a in kept] == [
        ("build-deb", ("a",)),
        ("trial-python", ("a",)),
        ("trial-deb", ("a",)),
    ]


def test_a_recordings_line_counts_archive_files_apart_from_python_files() -> None:
    recorded = Recorded(
        (
            artifact("build-deb", "1", ("a",)),
            artifact("build-python", "2", ("a",)),
            artifact("build-debian-file", "3", ("a",)),
            artifact("build-debian-file", "4", ("a",)),
        ),
        (),
    )
    assert recorded.summary() == "1 debs and 1 Python files, 2 Debian archive files (0.0 MB)"
