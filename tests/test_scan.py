"""The credential scan on a real directory tree: plain, nested, compressed, broken files, and
bearers no process handed over (issued before a kill), found by their shape."""

from __future__ import annotations

import base64
import bz2
import gzip
import io
import json
import lzma
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from runner.core.errors import RunnerError
from runner.core.files import read_model
from runner.proxy.bearer import BEARER_LENGTH, BEARER_PREFIX, BEARER_SHAPE, new_bearer
from runner.records.paths import RunPaths
from runner.scan import layers
from runner.scan.layers import CHUNK, MAX_DEPTH
from runner.scan.scan import ScanReport, new_canary, scan, scan_run

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
        ("trials/cell-1/log.gz", "provider_key", "gzip"),
        ("trials/cell-1/log.bz2", "bearer", "bzip2"),
        ("trials/cell-1/log.xz", "provider_key", "xz"),
        ("trials/cell-1/bundle.zip", "provider_key", "inner/agent.log"),
    }
    assert not report.clean
    written = paths.scan.read_text()
    assert KEY not in written and BEARER not in written


def test_a_secret_across_a_chunk_boundary_is_found(paths: RunPaths) -> None:
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


# A bearer from an earlier runner process: nobody passes it to the scan.
EARLIER = new_bearer()

PLANTED_BEARERS = {
    "at the end of a file": ("agent.log", ("token: " + EARLIER).encode(), None),
    "after an escaped newline": (
        "session.jsonl",
        json.dumps({"output": "env\nBENCH_PROXY_BEARER=\n" + EARLIER}).encode(),
        None,
    ),
    "after a colour code": ("term.log", b"\x1b[32m" + EARLIER.encode() + b"\x1b[0m", None),
    "in a gzip file": ("log.gz", gzip.compress(b"x" * 3_000_000 + EARLIER.encode()), "gzip"),
    "across a chunk boundary": (
        "big.bin",
        b"a" * (CHUNK - 40) + EARLIER.encode() + b"\n" + b"a" * 100,
        None,
    ),
}


@pytest.mark.parametrize("name, data, inside", PLANTED_BEARERS.values(), ids=PLANTED_BEARERS)
def test_a_bearer_is_found_by_its_shape_though_not_passed_in(
    paths: RunPaths, name: str, data: bytes, inside: str | None
) -> None:
    (paths.trial("cell-1") / name).write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [(leak.file, leak.kind, leak.inside) for leak in report.leaks] == [
        (f"trials/cell-1/{name}", "bearer", inside)
    ]
    assert not report.clean
    assert not BEARER_SHAPE.search(paths.scan.read_bytes())


def body(length: int) -> str:
    return (EARLIER[len(BEARER_PREFIX) :] * 2)[:length]


LOOK_ALIKES = {
    "one character short": BEARER_PREFIX + body(BEARER_LENGTH - len(BEARER_PREFIX) - 1) + "\n",
    "one character short at the end": BEARER_PREFIX + body(BEARER_LENGTH - len(BEARER_PREFIX) - 1),
    "no prefix": body(BEARER_LENGTH) + "\n",
}


@pytest.mark.parametrize("text", LOOK_ALIKES.values(), ids=LOOK_ALIKES)
def test_a_look_alike_is_not_a_bearer(paths: RunPaths, text: str) -> None:
    (paths.trial("cell-1") / "agent.log").write_text("said: " + text)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert report.clean and not report.leaks


FOLLOWED = {
    "by letters": EARLIER + "Zq\n",
    "by digits": EARLIER + "2026",
    "by an underscore and a word": EARLIER + "_cell_1",
    "by a dash": EARLIER + "-x",
}


@pytest.mark.parametrize("text", FOLLOWED.values(), ids=FOLLOWED)
def test_a_bearer_is_found_whatever_follows_it(paths: RunPaths, text: str) -> None:
    (paths.trial("cell-1") / "agent.log").write_text("BENCH_PROXY_BEARER=" + text)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [(leak.file, leak.kind) for leak in report.leaks] == [
        ("trials/cell-1/agent.log", "bearer")
    ]


def test_a_bearer_followed_by_letters_across_a_chunk_boundary_is_found(paths: RunPaths) -> None:
    # The first chunk ends right after the bearer; the next one goes on with letters.
    data = b" " * (CHUNK - BEARER_LENGTH) + EARLIER.encode() + b"Zq\n"
    (paths.trial("cell-1") / "big.bin").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [leak.file for leak in report.leaks] == ["trials/cell-1/big.bin"]


def test_a_secret_in_a_name_is_a_leak_shown_by_its_kind(paths: RunPaths) -> None:
    trial = paths.trial("cell-1")
    (trial / f"{EARLIER}.txt").write_text("nothing secret here\n")
    with zipfile.ZipFile(trial / "bundle.zip", "w") as archive:
        archive.writestr(f"keys/{KEY}.log", "key=" + KEY)
    expected = {
        ("trials/cell-1/<bearer>.txt", "bearer", None),
        ("trials/cell-1/bundle.zip", "provider_key", None),  # names are stored as they are
        ("trials/cell-1/bundle.zip", "provider_key", "keys/<provider_key>.log"),
    }
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert {(leak.file, leak.kind, leak.inside) for leak in report.leaks} == expected
    written = paths.scan.read_bytes()
    assert not BEARER_SHAPE.search(written) and KEY.encode() not in written
    # A resumed run scans the first scan's report too: it must add nothing.
    again = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert {(leak.file, leak.kind, leak.inside) for leak in again.leaks} == expected


def tarred(*members: tuple[str, bytes]) -> bytes:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return packed.getvalue()


def zipped(name: str, data: bytes) -> bytes:
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return packed.getvalue()


SECRET_LINE = f"Authorization: Bearer {EARLIER}\n".encode()
NESTED = {
    "gzip in gzip": (gzip.compress(gzip.compress(SECRET_LINE)), "gzip!gzip"),
    "zip in gzip": (gzip.compress(zipped("logs/agent.log", SECRET_LINE)), "gzip!logs/agent.log"),
    "tar in gzip": (gzip.compress(tarred(("agent.log", SECRET_LINE))), "gzip!agent.log"),
    "gzip in a tar in gzip": (
        gzip.compress(tarred(("log.gz", gzip.compress(SECRET_LINE)))),
        "gzip!log.gz!gzip",
    ),
    "xz in bzip2": (bz2.compress(lzma.compress(SECRET_LINE)), "bzip2!xz"),
    "gzip in zip": (zipped("log.gz", gzip.compress(SECRET_LINE)), "log.gz!gzip"),
}


@pytest.mark.parametrize("data, inside", NESTED.values(), ids=NESTED)
def test_nested_compression_is_searched_inside(paths: RunPaths, data: bytes, inside: str) -> None:
    (paths.trial("cell-1") / "packed").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert ("trials/cell-1/packed", "bearer", inside) in {
        (leak.file, leak.kind, leak.inside) for leak in report.leaks
    }
    assert not report.failures


def nested_gzip(levels: int) -> bytes:
    data = SECRET_LINE
    for _ in range(levels):
        data = gzip.compress(data)
    return data


UNREADABLE = {
    "nested beyond the depth": (nested_gzip(MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
    "a zstd stream": (b"\x28\xb5\x2f\xfd" + b"\x00" * 64, "zstd"),
    "a zstd stream in gzip": (gzip.compress(b"\x28\xb5\x2f\xfd" + b"\x00" * 64), "zstd"),
    "a 7z archive": (b"7z\xbc\xaf\x27\x1c" + b"\x00" * 64, "7z"),
    "a torn gzip in gzip": (gzip.compress(gzip.compress(SECRET_LINE)[:-12]), "gzip"),
    "a torn zip member in gzip": (gzip.compress(zipped("a.log", SECRET_LINE * 40)[:70]), "a.log"),
}


@pytest.mark.parametrize("data, error", UNREADABLE.values(), ids=UNREADABLE)
def test_a_container_the_scan_cannot_open_is_a_finding(
    paths: RunPaths, data: bytes, error: str
) -> None:
    (paths.trial("cell-1") / "packed").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [failure.file for failure in report.failures] == ["trials/cell-1/packed"]
    assert error in report.failures[0].error
    assert not report.clean


def test_the_depth_itself_is_searched(paths: RunPaths) -> None:
    (paths.trial("cell-1") / "packed").write_bytes(nested_gzip(MAX_DEPTH))
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [leak.inside for leak in report.leaks] == ["!".join(["gzip"] * MAX_DEPTH)]
    assert not report.failures


def test_a_decompression_bomb_is_a_finding_at_the_cap(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers, "MAX_INFLATED_BYTES", 8 << 20)
    # The cap holds for the file as a whole: each layer is under it, together they are not.
    inner = gzip.compress(b"\x00" * (5 << 20))
    bomb = gzip.compress(tarred(("a.gz", inner), ("b.gz", inner)))
    (paths.trial("cell-1") / "bomb.gz").write_bytes(bomb)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [failure.file for failure in report.failures] == ["trials/cell-1/bomb.gz"]
    assert f"more than {8 << 20} bytes inflated" in report.failures[0].error


def test_inflating_is_streamed_not_held_in_memory(paths: RunPaths) -> None:
    # 96 MiB inflated from a gzip and a zip in a tar.gz: streamed, the zip spooled to disk.
    packed = io.BytesIO()
    with (
        zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("zeros.bin", "w", force_zip64=True) as member,
    ):
        for _ in range(48):
            member.write(b"\x00" * (1 << 20))
    zeros = gzip.compress(b"\x00" * (48 << 20))
    data = gzip.compress(tarred(("a.gz", zeros), ("b.zip", packed.getvalue())))
    (paths.trial("cell-1") / "big.gz").write_bytes(data)
    tracemalloc.start()
    try:
        report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not report.failures and not report.leaks
    assert report.bytes_scanned > len(data)  # the compressed bytes: the file itself and the rest
    assert peak < 24 << 20


TEXT = f"key={KEY}\nAuthorization: Bearer {EARLIER}\n"
ENCODED = {
    "UTF-16LE with a BOM": b"\xff\xfe" + TEXT.encode("utf-16-le"),
    "UTF-16LE without": TEXT.encode("utf-16-le"),
    "UTF-16BE with a BOM": b"\xfe\xff" + TEXT.encode("utf-16-be"),
    "UTF-16BE without": TEXT.encode("utf-16-be"),
    "UTF-32LE with a BOM": b"\xff\xfe\x00\x00" + TEXT.encode("utf-32-le"),
    "UTF-32BE without": TEXT.encode("utf-32-be"),
    "UTF-16 among other text": ("Überprüfung " * 99 + TEXT + "Ende").encode("utf-16"),
}


@pytest.mark.parametrize("data", ENCODED.values(), ids=ENCODED)
def test_text_in_utf16_and_utf32_is_searched(paths: RunPaths, data: bytes) -> None:
    (paths.trial("cell-1") / "console.txt").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert {leak.kind for leak in report.leaks} == {"provider_key", "bearer"}


def b64(text: str, urlsafe: bool = False, padded: bool = True) -> str:
    encoded = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(text.encode()).decode()
    return encoded if padded else encoded.rstrip("=")


# The bearer at each of base64's three alignments, in both alphabets, padded or not.
BASE64 = {
    f"{alphabet}, {lead} before{'' if padded else ', unpadded'}": b64(
        "x" * lead + "Authorization: Bearer " + EARLIER, alphabet == "url-safe", padded
    )
    for alphabet in ("standard", "url-safe")
    for lead in (0, 1, 2)
    for padded in (True, False)
}


@pytest.mark.parametrize("encoded", BASE64.values(), ids=BASE64)
def test_a_bearer_in_base64_in_a_log_line_is_found(paths: RunPaths, encoded: str) -> None:
    (paths.trial("cell-1") / "agent.log").write_text(
        f"2026-12-02T13:00:00Z DEBUG headers={encoded} sent\n"
    )
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert [(leak.file, leak.kind) for leak in report.leaks] == [
        ("trials/cell-1/agent.log", "bearer")
    ]


def test_a_key_in_base64_in_json_and_across_a_chunk_boundary_is_found(paths: RunPaths) -> None:
    (paths.trial("cell-1") / "s.json").write_text(json.dumps({"env": b64(f"K={KEY}")}))
    blob = b64("y" * (CHUNK // 4 * 3) + KEY).encode()  # one run cut by the chunk's end
    (paths.trial("cell-1") / "blob.txt").write_bytes(b"data:" + blob)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert sorted((leak.file, leak.kind) for leak in report.leaks) == [
        ("trials/cell-1/blob.txt", "provider_key"),
        ("trials/cell-1/s.json", "provider_key"),
    ]


def test_a_tar_s_members_are_not_counted_as_inflated(
    paths: RunPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layers, "MAX_INFLATED_BYTES", 8 << 20)
    # 5 MiB inflated from the gzip; the tar's member is those bytes again, not more inflated.
    data = gzip.compress(tarred(("zeros.bin", b"\x00" * (5 << 20))))
    (paths.trial("cell-1") / "logs.tar.gz").write_bytes(data)
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    assert not report.failures and not report.leaks


def test_a_secret_in_base64_in_a_name_is_not_shown(paths: RunPaths) -> None:
    encoded = b64(EARLIER, urlsafe=True, padded=False)
    with zipfile.ZipFile(paths.trial("cell-1") / "bundle.zip", "w") as archive:
        archive.writestr(f"cache/{encoded}.json", f"token {EARLIER}")
    report = scan_run(paths, secrets_with())  # type: ignore[arg-type]
    # "cache/" is base64 too, so it goes with the run.
    assert ("trials/cell-1/bundle.zip", "<base64>.json") in {
        (leak.file, leak.inside) for leak in report.leaks
    }
    assert encoded not in paths.scan.read_text()


@pytest.mark.parametrize(
    "head",
    [b"\x1f\x8b" + bytes(range(2, 40)), b"\x1f\x8b\x08\xff" + bytes(60), b"BZh9" + bytes(60),
     b"\x1f\x9d\x90" + bytes(60)],
    ids=["gzip-magic-only", "gzip-reserved-flags", "bzip2-no-block", "compress-magic"],
)  # fmt: skip
def test_a_binary_that_only_starts_like_a_container_is_searched_as_bytes(
    tmp_path: Path, head: bytes
) -> None:
    """On a guest disk of many binaries, a short magic by chance is no corrupt container."""
    (tmp_path / "blob.bin").write_bytes(head + b"no secret in here\n")
    report = scan([tmp_path], {}, base=tmp_path)
    assert (report.failures, report.leaks, report.files_scanned) == ((), (), 1)
