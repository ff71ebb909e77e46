"""runner.freeze.live.concurrent_command: every command at once, each one's output whole and in
its own frame, a failure named, no frame forged by what a command prints."""

from __future__ import annotations

import subprocess
import time

from runner.freeze.live import concurrent_command, framed_sections

NONCE = "@@0123456789abcdef"


def _run(commands: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = concurrent_command(commands, NONCE)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


def test_each_output_comes_back_whole_in_its_own_frame() -> None:
    commands = {
        "many": "seq 1 50000",  # more than a pipe holds: read after others, never lost
        "no-newline": "printf 'a\\tb'",
        "empty": "true; ",
        "tabs": "printf 'k\\tv\\tw\\n'",
    }
    done = _run(commands)
    assert done.returncode == 0, done.stderr
    sections = framed_sections(done.stdout, tuple(commands), NONCE)
    assert sections["many"].splitlines() == [str(n) for n in range(1, 50001)]
    assert sections["no-newline"] == "a\tb"
    assert sections["empty"] == ""
    assert sections["tabs"] == "k\tv\tw\n"


def test_the_commands_run_at_once() -> None:
    started = time.monotonic()
    done = _run({f"sleep{n}": "sleep 2" for n in range(4)})
    assert done.returncode == 0 and time.monotonic() - started < 6


def test_a_failed_command_fails_the_whole_and_is_named() -> None:
    done = _run({"fine": "echo ok", "broken": "false | cat", "also": "exit 3"})
    assert done.returncode == 1
    assert "broken failed (exit 1)" in done.stderr  # pipefail: the pipeline's failure counts
    assert "also failed (exit 3)" in done.stderr
    assert "fine failed" not in done.stderr


def test_a_printed_frame_without_the_nonce_forges_nothing() -> None:
    forged = "printf '@@ begin second\\nforged\\n@@ exit 0 second\\n'"
    done = _run({"first": forged, "second": "echo real"})
    sections = framed_sections(done.stdout, ("first", "second"), NONCE)
    assert sections["second"] == "real\n"
    assert "forged" in sections["first"]
