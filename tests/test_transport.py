"""The SSH transport's logic that needs no SSH: the read loop's deadline and error wrapping."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import paramiko
import pytest

from runner.lab.transport import (
    GuestError,
    SshTransport,
    connection_errors,
    read_channel,
    wait_for_sshd,
)
from tests.support.loopback_sshd import loopback_lab, make_ed25519_key, public_line

# Always readable: a fake channel's output is there whenever it says so.
_READABLE, _WRITE_END = os.pipe()
os.write(_WRITE_END, b".")


class ChattyChannel:
    """A command that prints forever and never exits."""

    def __init__(self) -> None:
        self.closed = False
        self.eof_received = False
        self.status_event = threading.Event()

    def fileno(self) -> int:
        return _READABLE

    def recv_ready(self) -> bool:
        return True

    def recv(self, nbytes: int) -> bytes:
        return b"."

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, nbytes: int) -> bytes:
        return b""

    def exit_status_ready(self) -> bool:
        return False

    def recv_exit_status(self) -> int:
        raise AssertionError("a command that never exits has no exit status")

    def close(self) -> None:
        self.closed = True


class FinishedChannel(ChattyChannel):
    """A command that has exited with 7, its output still buffered."""

    def __init__(self) -> None:
        super().__init__()
        self.stdout = [b"last words"]
        self.eof_received = True
        self.status_event.set()

    def recv_ready(self) -> bool:
        return bool(self.stdout)

    def recv(self, nbytes: int) -> bytes:
        return self.stdout.pop()

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 7


def test_a_command_that_keeps_printing_still_times_out():
    channel = ChattyChannel()
    started = time.monotonic()
    code, stdout, _ = read_channel(channel, timeout=0.2)
    assert code is None
    assert channel.closed
    assert stdout.startswith(b"...")
    assert time.monotonic() - started < 1


def test_output_buffered_at_exit_is_kept():
    assert read_channel(FinishedChannel(), timeout=0.2) == (7, b"last words", b"")


class LateChannel(FinishedChannel):
    """As OpenSSH does: the exit status first, the rest of the output after, then EOF."""

    def __init__(self) -> None:
        super().__init__()
        self.arriving = [b"}", b"b" * 4096, b"a" * 8192]
        self.stdout = []
        self.eof_received = False
        self.polls = 0

    def recv_ready(self) -> bool:
        self.polls += 1
        if self.arriving and self.polls % 3 == 0:  # a piece arrives every third look
            self.stdout.append(self.arriving.pop())
        self.eof_received = not self.arriving and not self.stdout
        return bool(self.stdout)


def test_output_that_arrives_after_the_exit_status_is_read_to_its_end():
    code, stdout, _ = read_channel(LateChannel(), timeout=5)
    assert (code, len(stdout), stdout[-1:]) == (7, 8192 + 4096 + 1, b"}")


@pytest.mark.parametrize(
    "error",
    [paramiko.SSHException("Socket is closed"), EOFError(), OSError("reset"), TimeoutError()],
)
def test_connection_errors_become_one_guest_error_line(error: Exception):
    with pytest.raises(GuestError) as raised, connection_errors("127.0.0.1:2222", "copying x"):
        raise error
    message = str(raised.value)
    assert message.startswith("guest at 127.0.0.1:2222: copying x: ")
    assert "\n" not in message
    assert raised.value.__cause__ is None


def test_an_unreachable_guest_is_a_guest_error_naming_host_and_port(tmp_path: Path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    lab = loopback_lab(
        "t", port, tmp_path / "no-key", public_line(make_ed25519_key(tmp_path / "k"))
    )
    # Nothing listens on the port: the connection is refused at once, on loopback.
    with pytest.raises(GuestError, match=rf"guest at 127.0.0.1:{port}: did not answer SSH"):
        SshTransport.for_lab(lab).connect(wait_seconds=0)


def _late_banner(listener: socket.socket, delay: float) -> None:
    """A guest's sshd that accepts, then takes ``delay`` seconds to send its banner."""
    connection, _ = listener.accept()
    with connection:
        time.sleep(delay)
        connection.sendall(b"SSH-2.0-slow\r\n")


def test_a_guest_slow_to_send_its_banner_still_answers(tmp_path: Path):
    # What a TCG guest on a busy host does (the deploy's wait and its last look took a banner
    # 5 s late for no answer, and stopped the deploy).
    with socket.create_server(("127.0.0.1", 0)) as listener:
        lab = loopback_lab(
            "t", listener.getsockname()[1], tmp_path / "no-key",
            public_line(make_ed25519_key(tmp_path / "k")),
        )  # fmt: skip
        threading.Thread(target=_late_banner, args=(listener, 8.0), daemon=True).start()
        started = time.monotonic()
        wait_for_sshd(lab, 0)
    assert time.monotonic() - started >= 8.0
