"""The evidence archive: a finished run (FakeLab, no VM) archived, then tampered with in each way
a reviewer must catch; ``runner check-archive`` names each and exits 1, the untouched archive
passes, and two archives of one run directory are the same bytes.

Two kinds of tamperer: one who edits the tarball (and so cannot sign), and one who holds the
operator's key and archives an edited run directory afresh (the manifest signed again): the
ledger's chain, the trial evidence and the recomputed receipt must still catch the second.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import socket
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from functools import partial
from importlib import metadata
from pathlib import Path

import pytest
from rich.console import Console

from runner.archive import check as check_archive_module
from runner.archive.check import ArchiveBroken, check_archive, check_order, check_signatures
from runner.archive.tarball import DEFAULT_SIZE_LIMIT, read_manifest, unpack, write_archive
from runner.core.errors import InputError
from runner.core.files import read_model, write_model
from runner.core.roots import CACHE_ENV, REPO_ROOT
from runner.freeze.manifest import OracleScore
from runner.records.ledger import Ledger
from runner.records.paths import RunPaths
from runner.records.schedule import build_schedule
from runner.report import stats
from runner.report.judge import running_versions
from runner.report.signing import PublicKey
from runner.report.stats import Interval, Proportion
from runner.report.write import write_report
from runner.run.execute import ExecuteOptions, execute
from runner.spec.lock import load_lock
from runner.verify.report import VerifyReport
from tests.support.archive_readers import intact
from tests.support.fake_lab import FakeLab
from tests.support.fake_transport import FakeTransport, trial_tree
from tests.support.freeze_factory import manifest_of
from tests.support.hostile_archives import (
    copy_of,
    members_of,
    packed,
    rechained,
    trial_results_digest_only,
    two_lines_swapped,
    with_extra_member,
)
from tests.support.ledger_factory import line_for
from tests.test_failure_class import flaky_setup_guest
from tests.test_report_cli import runner_cli

DEMO = REPO_ROOT / "locks" / "demo.toml"
BROKEN = ArchiveBroken
BEARER_SHAPED = "fbr_" + "A" * 43


@pytest.fixture(scope="module")
def operator_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache of its own, so the operator key these tests make is theirs."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        yield cache


@pytest.fixture(scope="module")
def finished_run(operator_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo lock's 4 cells run on a fake guest, every trial's reward 0: 4 fails."""
    root = tmp_path_factory.mktemp("run")
    lab = FakeLab(FakeTransport(trials=trial_tree(root / "t", "fail")))
    receipt = execute(ExecuteOptions(DEMO, root / "run", "fake"), Console(file=io.StringIO()), lab)
    assert receipt.status == "completed", receipt.reasons
    return root / "run"


@pytest.fixture(scope="module")
def archive(finished_run: Path) -> Path:
    out = finished_run.parent / "run.tar.gz"
    write_archive(finished_run, out)
    return out


def rearchived(run_dir: Path, tmp_path: Path, edit: Callable[[RunPaths], None]) -> Path:
    """The tamperer with the key: edits a copy of the run directory and archives it afresh."""
    copy = copy_of(run_dir, tmp_path)
    edit(RunPaths(copy))
    out = tmp_path / "forged.tar.gz"
    write_archive(copy, out)
    return out


def repacked(archive: Path, tmp_path: Path, edit: Callable[[RunPaths], None]) -> Path:
    """The tamperer without the key: edits the tarball's members, keeps everything else."""
    tree = tmp_path / "tree"
    top = unpack(archive, tree)
    edit(RunPaths(tree / top))
    out = tmp_path / "repacked.tar.gz"
    files = sorted(path for path in (tree / top).rglob("*") if path.is_file())
    packed(out, [(path.relative_to(tree).as_posix(), path.read_bytes()) for path in files])
    return out


def broken(archive: Path) -> str:
    with pytest.raises(ArchiveBroken) as raised:
        check_archive(archive, None)
    return str(raised.value)


def raw_lines(paths: RunPaths) -> list[str]:
    return paths.ledger.read_text().splitlines(keepends=True)


def edit_line(paths: RunPaths, number: int, **changes: object) -> None:
    lines = raw_lines(paths)
    data = json.loads(lines[number - 1])
    data.update(changes)
    lines[number - 1] = json.dumps(data) + "\n"
    paths.ledger.write_text("".join(lines))


def test_the_untouched_archive_passes(archive: Path, finished_run: Path) -> None:
    verdict = intact(archive)
    assert (verdict.cells, verdict.status, verdict.chain.state) == (4, "completed", "intact")
    published_line = RunPaths(finished_run).receipt_public_key.read_text().strip()
    assert verdict.signed_by.line == " ".join(published_line.split()[:2])
    published = finished_run.parent / "published.pub"  # the reviewer's copy, its own comment
    key_type, key = RunPaths(finished_run).receipt_public_key.read_text().split()[:2]
    published.write_text(f"{key_type} {key} operator@lab\n")
    done = runner_cli("check-archive", str(archive), "--key", str(published))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("archive intact: run run, 4 cells, receipt completed")


def test_two_archives_of_one_run_are_the_same_bytes(finished_run: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    write_archive(finished_run, first)
    write_archive(finished_run, second)
    assert first.read_bytes() == second.read_bytes()


def test_the_archive_holds_no_canary_and_a_manifest(archive: Path, tmp_path: Path) -> None:
    top = unpack(archive, tmp_path)
    manifest = read_manifest(tmp_path / top)
    assert not (tmp_path / top / "attempts" / "scan-canary.txt").exists()
    assert [line.split(":")[0] for line in manifest.left_out] == ["attempts/scan-canary.txt"]
    assert manifest.size_limit == DEFAULT_SIZE_LIMIT and all(f.kept for f in manifest.files)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.mode, m.uname) for m in members} == {(0, 0, 0, 0o644, "")}


def test_large_files_are_kept_by_digest_only(finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "small.tar.gz"
    manifest = write_archive(finished_run, out, size_limit=10)
    left = {entry.path for entry in manifest.files if not entry.kept}
    assert "report.png" in left and any(path.endswith("/result.json") for path in left)
    assert not left & {"receipt.json", "cells.jsonl", "report.md", "verify/final.json"}
    with tarfile.open(out) as tar:
        assert "run/report.png" not in tar.getnames()
    verdict = intact(out)
    assert (verdict.digest_only, len(verdict.not_rejudged)) == (len(left), 4)


def test_outcomes_not_re_judged_are_named_and_exit_2_unless_accepted(
    finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "small.tar.gz"
    write_archive(finished_run, out, size_limit=0)  # every bulky file kept by digest only
    cells = [line.cell_id for line in Ledger(RunPaths(finished_run)).lines()]
    done = runner_cli("check-archive", str(out), "--trust-signer-in-archive")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("archive NOT RE-JUDGED: 4 outcomes not re-judged")
    for cell in cells:
        named = [line for line in lines if line.startswith(f"  not re-judged: {cell}: ")]
        assert len(named) == 1 and "kept by digest only" in named[0], lines
    accepted = runner_cli(
        "check-archive", str(out), "--trust-signer-in-archive", "--accept-digest-only"
    )
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    last = accepted.stdout.splitlines()[-1]
    assert (
        last.startswith("archive intact: run run, 4 cells") and "4 outcomes not re-judged" in last
    )


def test_a_trial_file_kept_by_digest_only_within_the_limit_is_refused(
    finished_run: Path, tmp_path: Path
) -> None:
    """The key holder marks a small trial file digest-only, to keep its outcome unjudged."""
    forged = tmp_path / "hidden.tar.gz"
    with trial_results_digest_only():
        write_archive(finished_run, forged)
    message = broken(forged)
    assert "kept by digest only" in message and "within the manifest's size limit" in message
    done = runner_cli("check-archive", str(forged), "--trust-signer-in-archive")
    assert done.returncode == 1 and done.stdout.splitlines()[-1].startswith("archive BROKEN: ")


def test_a_ledger_value_edited_fail_to_pass_breaks_the_chain(
    finished_run: Path, tmp_path: Path
) -> None:
    forged = rearchived(finished_run, tmp_path, lambda p: edit_line(p, 1, outcome="pass"))
    assert "ledger chain: cells.jsonl line 2" in broken(forged)


def rewritten(paths: RunPaths, first_line: dict[str, object]) -> None:
    """The ledger written again, linked afresh, its first line changed; the report again."""
    rechained(paths, lambda lines: [lines[0].model_copy(update=first_line), *lines[1:]])


def test_a_pass_rechained_and_reported_disagrees_with_its_trial(
    finished_run: Path, tmp_path: Path
) -> None:
    forge = partial(rewritten, first_line={"outcome": "pass", "reason": "reward 1"})
    message = broken(rearchived(finished_run, tmp_path, forge))
    assert "says pass, its trial says fail (reward 0)" in message


def attempt_record(paths: RunPaths, number: int) -> Path:
    return paths.attempt(Ledger(paths).lines()[0].cell_id, number)


def test_an_interrupted_attempt_is_kept_apart(finished_run: Path, tmp_path: Path) -> None:
    def resumed(paths: RunPaths) -> None:
        first = json.loads(attempt_record(paths, 1).read_text())
        attempt_record(paths, 2).write_text(json.dumps({**first, "attempt": 2}))
        interrupted = {**first, "status": "interrupted", "failure_class": "cancelled"}
        attempt_record(paths, 1).write_text(json.dumps(interrupted))
        rewritten(paths, {"attempt": 2})

    assert intact(rearchived(finished_run, tmp_path, resumed)).chain.state == "intact"


def test_an_attempt_record_contradicting_the_ledger_is_named(
    finished_run: Path, tmp_path: Path
) -> None:
    def interrupt(paths: RunPaths) -> None:
        record = json.loads(attempt_record(paths, 1).read_text())
        attempt_record(paths, 1).write_text(json.dumps({**record, "status": "interrupted"}))

    message = broken(rearchived(finished_run, tmp_path, interrupt))
    assert message.endswith(": the ledger's attempt 1 is interrupted")


def test_a_dropped_line_breaks_the_chain(finished_run: Path, tmp_path: Path) -> None:
    def drop(paths: RunPaths) -> None:
        lines = raw_lines(paths)
        paths.ledger.write_text("".join(lines[:1] + lines[2:]))

    assert "ledger chain: cells.jsonl line 2" in broken(rearchived(finished_run, tmp_path, drop))


def test_a_dropped_last_line_misses_the_receipts_head(finished_run: Path, tmp_path: Path) -> None:
    def drop(paths: RunPaths) -> None:
        paths.ledger.write_text("".join(raw_lines(paths)[:-1]))

    message = broken(rearchived(finished_run, tmp_path, drop))
    assert "the receipt's head is not cells.jsonl's last line (4 lines signed, 3" in message


def test_two_reordered_lines_break_the_chain(finished_run: Path, tmp_path: Path) -> None:
    def reorder(paths: RunPaths) -> None:
        lines = raw_lines(paths)
        lines[1], lines[2] = lines[2], lines[1]
        paths.ledger.write_text("".join(lines))

    message = broken(rearchived(finished_run, tmp_path, reorder))
    assert "ledger chain: cells.jsonl line 2" in message


def test_a_swapped_trial_file_is_named(finished_run: Path, tmp_path: Path) -> None:
    def swap(paths: RunPaths) -> None:
        result = next(paths.trials_dir.glob("*/trial-1/result.json"))
        fixture = json.loads((REPO_ROOT / "tests/harbor_results/pass.json").read_text())
        result.write_text(json.dumps(fixture["result"]))

    message = broken(rearchived(finished_run, tmp_path, swap))
    assert "/trial-1/result.json: not the sha256 its ledger line" in message


def test_a_member_edited_in_the_tarball_is_not_the_manifests(archive: Path, tmp_path: Path) -> None:
    def forge(paths: RunPaths) -> None:  # same size: it passes the unpacking's size check
        lines = raw_lines(paths)
        lines[0] = lines[0].replace('"outcome":"fail"', '"outcome":"pass"')
        paths.ledger.write_text("".join(lines))

    forged = repacked(archive, tmp_path, forge)
    assert broken(forged) == "cells.jsonl: not the sha256 the manifest records"


def test_a_member_over_its_manifest_size_is_refused_before_unpacking(
    archive: Path, tmp_path: Path
) -> None:
    forged = repacked(archive, tmp_path, lambda p: edit_line(p, 1, outcome="pass"))
    message = broken(forged)
    assert message.endswith("the manifest says 6410 B") or "member 'run/cells.jsonl' is " in message
    assert not (tmp_path / "check").exists()


def test_an_altered_receipt_fails_its_signature(archive: Path, tmp_path: Path) -> None:
    def alter(paths: RunPaths) -> None:
        # the same size, so the unpacking's size check lets it through to the signature
        paths.receipt.write_text(paths.receipt.read_text().replace("completed", "COMPLETED"))

    message = broken(repacked(archive, tmp_path, alter))
    assert message.startswith("receipt.sig: not the operator's signature of receipt.json")


def test_a_replaced_signature_fails(archive: Path, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)

    def resign(paths: RunPaths) -> None:
        signing = ["ssh-keygen", "-Y", "sign", "-q", "-f", str(other), "-n", "frozen-bench-receipt"]
        signed = subprocess.run(signing, input=paths.receipt.read_bytes(), capture_output=True)
        paths.receipt_signature.write_bytes(signed.stdout)

    message = broken(repacked(archive, tmp_path, resign))
    assert message.startswith("receipt.sig: not the operator's signature of receipt.json")


def test_a_planted_bearer_is_found_and_named(archive: Path, tmp_path: Path) -> None:
    def plant(paths: RunPaths) -> None:
        result = next(paths.trials_dir.glob("*/trial-1/result.json"))
        assert result.stat().st_size == len(BEARER_SHAPED)  # the same size: unpacked, scanned
        result.write_text(BEARER_SHAPED)

    forged = repacked(archive, tmp_path, plant)
    message = broken(forged)
    assert message.startswith("credential scan: a bearer-shaped string in")
    assert "/trial-1/result.json" in message and BEARER_SHAPED not in message
    done = runner_cli("check-archive", str(forged), "--trust-signer-in-archive")
    assert done.returncode == 1
    assert done.stdout.splitlines()[1].startswith("archive BROKEN: credential scan")


def test_an_archive_holding_a_bearer_is_refused(finished_run: Path, tmp_path: Path) -> None:
    copy = copy_of(finished_run, tmp_path)
    next(RunPaths(copy).trials_dir.glob("*/trial-1/harbor.log")).write_text(BEARER_SHAPED)
    out = tmp_path / "refused.tar.gz"
    done = runner_cli("archive", str(copy), "--out", str(out))
    assert done.returncode == 1 and not out.exists()
    assert "archive refused: the credential scan found a bearer" in done.stderr


def plant_drift(paths: RunPaths) -> None:
    report = json.loads(paths.final_verify.read_text())
    report["drifts"] = [{"check": "file:/etc/x", "expected": "a", "found": "b"}]
    paths.final_verify.write_text(json.dumps(report))


def plant_leak(paths: RunPaths) -> None:
    scan = json.loads(paths.scan.read_text())
    scan["leaks"], scan["clean"] = [{"file": "trials/x/log", "kind": "provider_key"}], False
    paths.scan.write_text(json.dumps(scan))


@pytest.mark.parametrize("evidence", [plant_drift, plant_leak], ids=["drift", "leak"])
def test_a_drift_or_a_leak_must_fail_the_receipt(
    finished_run: Path, tmp_path: Path, evidence: Callable[[RunPaths], None]
) -> None:
    message = broken(rearchived(finished_run, tmp_path, evidence))
    assert "receipt.json: status completed, the evidence gives failed_closed" in message


def test_a_ledger_from_before_the_chain_is_reported_unchained(
    finished_run: Path, tmp_path: Path
) -> None:
    def unchain(paths: RunPaths) -> None:
        lines = [json.loads(raw) for raw in raw_lines(paths)]
        paths.ledger.write_text(
            "".join(json.dumps({**line, "previous_sha256": None}) + "\n" for line in lines)
        )
        assert write_report(paths.run_dir).ledger_chain.state == "unchained"  # type: ignore[union-attr]
        assert "| ledger chain | unchained (4 lines) |" in paths.report_md.read_text()

    verdict = intact(rearchived(finished_run, tmp_path, unchain))
    assert (verdict.chain.state, verdict.status) == ("unchained", "completed")


def test_a_line_ended_early_needs_its_exception_kept(finished_run: Path, tmp_path: Path) -> None:
    def forge(paths: RunPaths) -> None:
        edit_line(paths, 4, outcome="indeterminate", reason="ended early: x")
        write_report(paths.run_dir)  # the last line: the receipt's head is signed again

    message = broken(rearchived(finished_run, tmp_path, forge))
    assert "the line says it ended early, its attempt record keeps no exception" in message


def test_a_pinned_key_must_be_the_signers(archive: Path, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    done = runner_cli("check-archive", str(archive), "--key", f"{other}.pub")
    assert done.returncode == 1
    pinned = PublicKey.parse(Path(f"{other}.pub").read_text(), "pin").fingerprint
    assert done.stdout == (
        "archive BROKEN: archive-manifest.sig: not a signature of archive-manifest.json by the "
        f"pinned key {pinned} (signature does not verify)\n"
    )


def test_a_member_outside_the_run_is_a_broken_link(archive: Path, tmp_path: Path) -> None:
    out = packed(tmp_path / "outside.tar.gz", [("run/../../escape", b"x")])
    assert broken(out).endswith(
        "at byte 0 of the tar stream, member name 'run/../../escape' is not in canonical form"
    )
    assert not (tmp_path.parent / "escape").exists()


def test_a_truncated_archive_is_a_broken_link(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "cut.tar.gz"
    out.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert broken(out).endswith(
        f"at byte {out.stat().st_size} of the file, the file ends inside the compressed stream"
    )


def test_a_link_out_of_the_run_is_left_out(finished_run: Path, tmp_path: Path) -> None:
    copy = copy_of(finished_run, tmp_path)
    (tmp_path / "host-file").write_text("the controller's, not the run's")
    (RunPaths(copy).verify_dir / "host-file").symlink_to(tmp_path / "host-file")
    manifest = write_archive(copy, tmp_path / "linked.tar.gz")
    assert "verify/host-file: a link out of the run directory" in manifest.left_out
    assert manifest.file("verify/host-file") is None
    with pytest.raises(InputError, match="cannot be written inside it"):
        write_archive(copy, copy / "inside.tar.gz")


def test_a_run_with_a_retried_attempt_archives_and_checks(
    operator_cache: Path, tmp_path: Path
) -> None:
    lock_path = tmp_path / "retry.toml"
    retry = '\n[retry]\nclasses = ["setup_failure"]\nmax_attempts = 2\n'
    lock_path.write_text(
        DEMO.read_text().replace("schedule_seed = 7\n", f"schedule_seed = 7\n{retry}")
    )
    options = ExecuteOptions(lock_path, tmp_path / "run", "fake")
    execute(options, Console(file=io.StringIO()), FakeLab(flaky_setup_guest(tmp_path)))
    manifest = write_archive(tmp_path / "run", tmp_path / "run.tar.gz")
    assert any(entry.path.endswith("/attempt-1/line.json") for entry in manifest.files)
    verdict = intact(tmp_path / "run.tar.gz")
    assert (verdict.cells, verdict.status, verdict.chain.state) == (4, "completed", "intact")


def forger_key(tmp_path: Path) -> Path:
    key = tmp_path / "forger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def signed_by_forger(key: Path, data: bytes) -> bytes:
    signing = ["ssh-keygen", "-Y", "sign", "-q", "-f", str(key), "-n", "frozen-bench-receipt"]
    return subprocess.run(signing, input=data, capture_output=True, check=True).stdout


def test_a_key_file_of_two_keys_cannot_pass_the_pin(
    archive: Path, finished_run: Path, tmp_path: Path
) -> None:
    """The published key first, the forger's second, everything signed by the forger alone:
    the pin compares one key, so the file is refused, not searched for a key that verifies.
    (Checked on the unpacked tree: in a tarball the grown key file is refused earlier, by the
    unpacking's size check.)"""
    forger = forger_key(tmp_path)
    operator = RunPaths(finished_run).receipt_public_key.read_text().strip()
    both = f"{operator}\n{Path(f'{forger}.pub').read_text().strip()}"
    tree = tmp_path / "tree"
    paths = RunPaths(tree / unpack(archive, tree))
    paths.receipt_public_key.write_text(both + "\n")
    manifest_file = paths.run_dir / "archive-manifest.json"
    manifest_file.write_text(
        json.dumps({**json.loads(manifest_file.read_text()), "signed_by": both})
    )
    for data, signature in (
        ("archive-manifest.json", "archive-manifest.sig"),
        ("receipt.json", "receipt.sig"),
    ):
        signed = signed_by_forger(forger, (paths.run_dir / data).read_bytes())
        (paths.run_dir / signature).write_bytes(signed)
    with pytest.raises(InputError) as raised:
        check_signatures(paths, read_manifest(paths.run_dir), PublicKey.parse(operator, "pin"))
    assert str(raised.value) == "receipt-key.pub: must be exactly one public key line, found 2"


@pytest.mark.parametrize(
    "text",
    ["", "ssh-ed25519\n", "ssh-ed25519 AAAA\n", "not-a-type AAAAC3NzaC1lZDI1NTE5AAAA\n", "two"],
    ids=["empty", "type-only", "bad-body", "bad-type", "one-token"],
)
def test_a_pin_that_is_not_one_key_is_refused(archive: Path, tmp_path: Path, text: str) -> None:
    pin = tmp_path / "pin.pub"
    pin.write_text(text)
    done = runner_cli("check-archive", str(archive), "--key", str(pin))
    assert done.returncode == 2 and "archive intact" not in done.stdout
    assert f"--key {pin}: " in done.stderr


def test_a_pin_file_of_two_keys_is_refused(
    archive: Path, finished_run: Path, tmp_path: Path
) -> None:
    operator = RunPaths(finished_run).receipt_public_key.read_text().strip()
    pin = tmp_path / "pin.pub"
    pin.write_text(f"{Path(f'{forger_key(tmp_path)}.pub').read_text()}{operator}\n")
    done = runner_cli("check-archive", str(archive), "--key", str(pin))
    assert done.returncode == 2 and "must be exactly one public key line, found 2" in done.stderr


def test_without_a_pin_the_check_refuses_unless_told_to_trust_the_archive(
    archive: Path, finished_run: Path
) -> None:
    refused = runner_cli("check-archive", str(archive))
    assert refused.returncode == 2 and "the signer is unpinned" in refused.stderr
    assert "archive intact" not in refused.stdout
    trusted = runner_cli("check-archive", str(archive), "--trust-signer-in-archive")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    first, verdict = trusted.stdout.splitlines()
    assert first.startswith("signer UNPINNED")
    assert verdict.startswith("archive intact") and verdict.endswith("signer UNPINNED")


def test_the_operator_key_names_its_host_and_fingerprint(finished_run: Path) -> None:
    """Two operators' keys never print alike: the comment says where the key was made, and the
    report and the verdict print its fingerprint."""
    line = RunPaths(finished_run).receipt_public_key.read_text().strip()
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", "-"], input=line, text=True, capture_output=True, check=True
    ).stdout.split()[1]
    assert "lab-operator" not in line
    assert f"host {socket.gethostname()}, " in line and line.endswith(fingerprint)
    assert (
        f"| signer fingerprint | `{fingerprint}` |" in RunPaths(finished_run).report_md.read_text()
    )


def truncated_gzip(data: bytes) -> bytes:
    whole = gzip.compress(data, mtime=0)
    return whole[: len(whole) - 12]  # the stream's end and its trailer cut off


def gzip_with_trailing_junk(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0) + b"J"  # not a zero: gzip allows zero padding


# What each damage gives first: a truncated stream cut the bearer off; junk after a whole
# stream leaves it readable (zcat shows it, and so does the scan), the junk a finding besides.
DAMAGES = {
    "truncated": (truncated_gzip, "", "{} cannot be read to its end"),
    "trailing-junk": (gzip_with_trailing_junk, "a bearer-shaped string in ", "{} (inside gzip)"),
}


@pytest.mark.parametrize("damaged, what, first", DAMAGES.values(), ids=DAMAGES)
def test_a_compressed_file_the_scan_cannot_read_to_its_end_is_a_finding(
    archive: Path,
    finished_run: Path,
    tmp_path: Path,
    damaged: Callable[[bytes], bytes],
    what: str,
    first: str,
) -> None:
    """What the scan could not read may hold a bearer (zcat shows it): archiving it is refused,
    and an archive carrying it is broken, the file named."""
    padding = bytes(range(256)) * 512  # incompressible, so the bearer sits past the cut
    payload = damaged(padding + f"Authorization: Bearer {BEARER_SHAPED}\n".encode())
    copy = copy_of(finished_run, tmp_path)
    next(RunPaths(copy).trials_dir.glob("*/trial-1")).joinpath("agent.log.gz").write_bytes(payload)
    out = tmp_path / "refused.tar.gz"
    done = runner_cli("archive", str(copy), "--out", str(out))
    assert done.returncode == 1 and not out.exists()
    assert "archive refused: the credential scan found " in done.stderr
    assert f"found {what}run/trials/" in done.stderr
    assert first.format("/trial-1/agent.log.gz") in done.stderr

    def plant(paths: RunPaths) -> None:  # over a member, at its size: unpacked, then scanned
        size = paths.ledger.stat().st_size
        assert len(payload) < size
        paths.ledger.write_bytes(payload + b"J" * (size - len(payload)))

    message = broken(repacked(archive, tmp_path, plant))
    assert message.startswith(f"credential scan: {what}" + first.format("run/cells.jsonl"))


NOT_FIRST = "`runner archive` writes <run>/archive-manifest.json (at most 67108864 B) first"
OVER_COUNT = "over the cap of {} members (what the signed manifest lists)"


@pytest.mark.parametrize(
    ("name", "first", "said"),
    [
        ("run/cells.jsonl", True, f"the first member is 'run/cells.jsonl' of 3000 B, {NOT_FIRST}"),
        ("run/cells.jsonl", False, f"'run/cells.jsonl' of 3000 B is {OVER_COUNT}"),
        ("run/./cells.jsonl", True, "member name 'run/./cells.jsonl' is not in canonical form"),
        ("run//cells.jsonl", True, "member name 'run//cells.jsonl' is not in canonical form"),
        ("run/planted.bin", True, f"the first member is 'run/planted.bin' of 3000 B, {NOT_FIRST}"),
        ("run/planted.bin", False, f"'run/planted.bin' of 3000 B is {OVER_COUNT}"),
    ],
    ids=["duplicate-first", "duplicate-last", "dot-alias", "slash-alias", "unlisted-first",
         "unlisted-last"],
)  # fmt: skip
def test_a_member_is_refused_and_nothing_is_left_written(
    archive: Path, tmp_path: Path, name: str, first: bool, said: str
) -> None:
    """A forged ledger placed before the signed manifest (refused before anything is written)
    or after the genuine members (one member more than the signed manifest lists), under its
    own name or an alias, or a member the manifest does not list: refused from the headers and
    the signed manifest, and what was unpacked before it removed."""
    forged = with_extra_member(archive, tmp_path / "forged.tar.gz", name, b"{}\n" * 1000, first)
    said = said.format(len(members_of(archive)))  # the one member more is over the count
    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(InputError) as raised:
        unpack(forged, tree)
    assert str(raised.value).endswith(said)
    assert list(tree.iterdir()) == []
    assert broken(forged).endswith(said)


def test_a_member_name_cannot_repaint_the_terminal(archive: Path, tmp_path: Path) -> None:
    name = "run/\x1b[2K\rarchive intact: run run, 4 cells, receipt completed"
    forged = with_extra_member(archive, tmp_path / "forged.tar.gz", name, b"x", False)
    done = runner_cli("check-archive", str(forged), "--trust-signer-in-archive")
    assert done.returncode == 1
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    assert "archive BROKEN: " in done.stdout and "\\x1b[2K\\r" in done.stdout


def test_a_verifier_setup_verdict_is_rejudged_from_its_trial_and_mirror_lines(
    finished_run: Path, tmp_path: Path
) -> None:
    """A fail turned indeterminate by a forged cause: the cell's own mirror lines (the run kept
    none: its lab had no mirror) and its trial show no setup that failed."""

    def forge(paths: RunPaths) -> None:
        reason = "verifier_setup: the lab's mirror does not have pypi:pytest"
        edit_line(paths, 4, outcome="indeterminate", reason=reason)
        write_report(paths.run_dir)

    message = broken(rearchived(finished_run, tmp_path, forge))
    assert "its trial and mirror log say the verifier set up" in message


def test_a_no_model_request_verdict_is_rejudged_from_its_trial_and_proxy_record(
    finished_run: Path, tmp_path: Path
) -> None:
    """A fail turned indeterminate by a forged cause: its proxy record has the cell's requests
    and its trial no harness that ended with an error."""

    def forge(paths: RunPaths) -> None:
        reason = "no_model_request: the harness ended with an error before any request"
        edit_line(paths, 4, outcome="indeterminate", reason=reason)
        write_report(paths.run_dir)

    message = broken(rearchived(finished_run, tmp_path, forge))
    assert "its trial and proxy record say the harness asked its model or ended well" in message


def kept_freeze(paths: RunPaths, task: str, reward: float) -> None:
    """The run keeps a freeze manifest whose oracle of ``task`` scored ``reward``, and the final
    verify audited that manifest (a forger with the key rewrites both consistently)."""
    collected = {"kernel": "6.12", "packages": {}, "images": [], "listening": []}
    oracle = (OracleScore(task=task, reward=reward, seconds=1.0),)
    freeze = manifest_of({}, collected).model_copy(update={"oracle": oracle})
    write_model(paths.freeze_manifest, freeze)
    final = read_model(paths.final_verify, VerifyReport)
    audited = {"freeze_manifest_sha256": freeze.sha256}
    write_model(paths.final_verify, final.model_copy(update=audited))


def test_an_unjudged_verdict_needs_the_kept_freezes_oracle_below_1(
    finished_run: Path, tmp_path: Path
) -> None:
    def forge(reward: float) -> Callable[[RunPaths], None]:
        def edit(paths: RunPaths) -> None:
            task = Ledger(paths).lines()[3].task
            kept_freeze(paths, task, reward)
            edit_line(paths, 4, outcome="indeterminate", reason=f"unjudged: {task} scored 0")
            write_report(paths.run_dir)

        return edit

    message = broken(rearchived(finished_run, tmp_path / "judged", forge(1.0)))
    assert "is unjudged, the freeze manifest's oracle of it scored 1" in message
    verdict = intact(rearchived(finished_run, tmp_path / "unjudged", forge(0.0)))
    assert (verdict.cells, verdict.not_rejudged) == (4, ())


def test_a_kept_freeze_manifest_must_be_the_one_the_final_verify_audited(
    finished_run: Path, tmp_path: Path
) -> None:
    def forge(paths: RunPaths) -> None:
        kept_freeze(paths, "any-task", 1.0)
        final = read_model(paths.final_verify, VerifyReport)
        other = {"freeze_manifest_sha256": "sha256:" + "e" * 64}
        write_model(paths.final_verify, final.model_copy(update=other))
        write_report(paths.run_dir)

    assert "freeze.json: its sha256 is sha256:" in broken(rearchived(finished_run, tmp_path, forge))


def under_other_scipy(monkeypatch: pytest.MonkeyPatch) -> str:
    """check-archive runs under a scipy the receipt's judge does not name; the receipt's."""
    running = {**running_versions(), "scipy": "0.0.1"}
    monkeypatch.setattr(check_archive_module, "running_versions", lambda: running)
    return metadata.version("scipy")


def other_intervals(monkeypatch: pytest.MonkeyPatch, extra_passes: int = 0) -> None:
    """Pass-rate intervals as another scipy might compute them; ``extra_passes``: a count no
    version changes, changed too."""
    real = stats.wilson

    def wilson(successes: int, n: int) -> Proportion:
        found = real(successes, n)
        if found.interval is None:
            return found
        narrower = Interval(low=found.interval.low, high=found.interval.high * 0.9)
        return Proportion(
            successes=successes + extra_passes, n=n, rate=found.rate, interval=narrower
        )

    monkeypatch.setattr(stats, "wilson", wilson)


def test_under_other_versions_the_differing_report_lines_are_named(
    archive: Path, finished_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receipt_scipy = under_other_scipy(monkeypatch)
    said = f"recomputed under other versions: scipy 0.0.1 (receipt {receipt_scipy}); "
    assert intact(archive).lines(False)[0] == said + "report.md recomputes the same"
    other_intervals(monkeypatch)
    verdict = intact(archive)
    assert verdict.other_versions is not None
    differing = verdict.other_versions.report_lines
    first, last = verdict.lines(False)
    named = ", ".join(str(number) for number in differing[:10])
    assert first.startswith(f"{said}report.md lines {named} and {len(differing) - 10} more differ")
    assert last.startswith("archive intact: ")
    report = RunPaths(finished_run).report_md.read_text().splitlines()
    # Each names a pass rate's interval ("3/4 = 0.750 [0.301, 0.954]").
    assert all(re.search(r"\d+/\d+ = [\d.]+ \[", report[n - 1]) for n in differing), differing


def test_a_report_that_differs_under_the_same_versions_is_broken(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_intervals(monkeypatch)
    assert broken(archive) == "receipt.json: batches does not recompute from the run's files"


def test_other_versions_excuse_no_changed_count(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    under_other_scipy(monkeypatch)
    other_intervals(monkeypatch, extra_passes=1)
    assert broken(archive) == "receipt.json: batches does not recompute from the run's files"


def test_other_versions_excuse_no_edit_outside_the_statistics(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def edit(paths: RunPaths) -> None:
        paths.report_md.write_text(paths.report_md.read_text().replace("completed", "complete"))

    forged = rearchived(finished_run, tmp_path, edit)
    under_other_scipy(monkeypatch)
    assert broken(forged) == "report.md: its tables do not recompute from the ledger"


def test_two_ledger_lines_swapped_and_linked_afresh_break_the_schedule_order(
    finished_run: Path, tmp_path: Path
) -> None:
    """The key holder swaps two lines of a serial run and re-chains and re-signs the ledger:
    the chain holds, the order the schedule gave the run does not."""
    paths = RunPaths(finished_run)
    first, second = (line.cell_id for line in Ledger(paths).lines()[1:3])
    forged = rearchived(finished_run, tmp_path, partial(rechained, edit=two_lines_swapped))
    message = broken(forged)
    assert message == (
        f"cells.jsonl: {first} is recorded after {second}, which the schedule runs after it "
        "(serial)"
    )


def test_a_batch_per_host_run_keeps_each_batch_in_order_not_the_whole_run() -> None:
    """On a fleet, batches run at once on different hosts: their lines interleave, each batch's
    own in the schedule's order."""
    schedule = build_schedule(load_lock(DEMO))
    first, second = schedule.batches[0].cells[:2]
    interleaved = [line_for(cell) for cell in (first, schedule.batches[1].cells[0], second)]
    check_order(schedule, interleaved, "batch-per-host")
    with pytest.raises(ArchiveBroken, match="which the schedule runs after it"):
        check_order(schedule, interleaved, "serial")
    with pytest.raises(ArchiveBroken, match=f"{first.id} is recorded after {second.id}"):
        check_order(schedule, [line_for(second), line_for(first)], "batch-per-host")
