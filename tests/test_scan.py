"""The credential scan on a real directory tree: plain, nested, compressed, broken files."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from runner.errors import RunnerError
from runner.files import read_model
from runner.paths import RunPaths
from runner.scan import ScanReport, new_canary, scan_run

KEY = "sk-real-provider-key-7f3a9c2e"
BEARER = "bearer-of-cell-1-AbCdEfGhIjKl"


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "run")
    paths.trial("cell-1").mkdir(parents=True)
    paths.proxy_dir.mkdir()
    paths.ledger.write_text('{"cell_id": "cell-1"}\n')
    (paths.trial("cell-1") / "agent.log").write_text("nothing secret here\n")
    return paths


def secrets_with(canary: str | None = None) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"provider_key": [KEY], "bearer": [BEARER]}
    if canary:
        found["canary"] = [canary]
    return found


def test_a_clean_run_finds_only_its_canary(paths: RunPaths) -> None:
    canary = new_canary()
    (paths.trial("cell-1") / "canary.txt").write_text(canary)
    report = scan_run(paths, secrets_with(canary))  # type: ignore[arg-type]
    assert report.clean and not report.leaks
    assert report.canary_hits == ("trials/cell-1/canary.txt",)
    assert report.files_scanned == 3
    assert report.secrets_checked == {"provider_key": 1, "bearer": 1, "canary": 1}
    assert read_model(paths.scan, ScanReport) == report


def test_a_planted_canary_that_is_not_found_makes_the_scan_unclean(paths: RunPaths) -> None:
    report = scan_run(paths, secrets_with(new_canary()))  # type: ignore[arg-type]
    assert not report.leaks and not report.clean


def test_leaks_are_found_in_plain_json_and_compressed_files(paths: RunPaths) -> None:
    trial = paths.trial("cell-1")
    (trial / "session.jsonl").write_text(json.dumps({"headers": {"Authorization": BEARER}}))
    (trial / "deep" / "er").mkdir(parents=True)
    (trial / "deep" / "er" / "core.bin").write_bytes(b"\x00\xff" * 5000 + KEY.encode() + b"\x00")
    (trial / "log.gz").write_bytes(gzip.compress(b"x" * 3_000_000 + KEY.encode()))
    (trial / "log.bz2").write_bytes(bz2.compress(BEARER.encode()))
    (trial / "log.xz").write_bytes(lzma.compress(b"z" * 100_000 + KEY.encode()))
    with zipfile.ZipFile(trial / "bundle.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("inner/agent.log", "key=" + KEY)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    found = {(leak.file, leak.kind, leak.inside) for leak in report.leaks}
    assert found == {
        ("trials/cell-1/session.jsonl", "bearer", None),
        ("trials/cell-1/deep/er/core.bin", "provider_key", None),
        ("trials/cell-1/log.gz", "provider_key", "1f8b"),
        ("trials/cell-1/log.bz2", "bearer", "425a68"),
        ("trials/cell-1/log.xz", "provider_key", "fd377a585a00"),
        ("trials/cell-1/bundle.zip", "provider_key", "inner/agent.log"),
    }
    assert not report.clean
    written = paths.scan.read_text()
    assert KEY not in written and BEARER not in written


def test_a_secret_across_a_chunk_boundary_is_found(paths: RunPaths) -> None:
    from runner.scan import CHUNK

    data = b"a" * (CHUNK - 5) + KEY.encode() + b"a" * 10
    (paths.trial("cell-1") / "big.bin").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [leak.file for leak in report.leaks] == ["trials/cell-1/big.bin"]


def test_a_json_escaped_secret_is_found(paths: RunPaths) -> None:
    quoted = 'sk-with/"quote"-and-slash-0123'
    (paths.proxy_dir / "c.json").write_text(json.dumps({"k": quoted}))
    report = scan_run(paths, {"provider_key": [quoted]})
    assert [leak.file for leak in report.leaks] == ["proxy/c.json"]


def test_an_unreadable_compressed_file_fails_the_scan(paths: RunPaths) -> None:
    (paths.trial("cell-1") / "torn.gz").write_bytes(gzip.compress(b"y" * 1000)[:20])
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [failure.file for failure in report.failures] == ["trials/cell-1/torn.gz"]
    assert not report.clean


def test_missing_roots_are_listed(paths: RunPaths, tmp_path: Path) -> None:
    report = scan_run(paths, secrets_with(), extra_roots=[tmp_path / "elsewhere"])  # type: ignore[arg-type]
    assert report.roots_scanned == (".",)
    assert report.missing_roots == (str(tmp_path / "elsewhere"),)


def test_short_secrets_are_refused(paths: RunPaths) -> None:
    with pytest.raises(RunnerError, match="shorter than"):
        scan_run(paths, {"provider_key": ["abc"]})


def test_a_report_claiming_clean_with_leaks_does_not_load(paths: RunPaths) -> None:
    (paths.trial("cell-1") / "leak.txt").write_text(KEY)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    forged = report.model_dump(mode="json") | {"clean": True}
    with pytest.raises(ValidationError, match="clean must be False"):
        ScanReport.model_validate(forged)
