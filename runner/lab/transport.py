"""The narrow transport to the guest: connect, exec, upload, download.

Everything the runner does inside the guest goes through the ``GuestTransport`` protocol;
``exec`` returns an ``ExecResult`` model. ``SshTransport`` implements it over Paramiko; tests use
the fake in tests/support/fake_transport.py. Directory trees travel as tar streams over one exec
channel (one round trip, no per-file SFTP requests). Whatever breaks the connection surfaces as
a ``GuestError`` naming the guest and what was being done, never as a Paramiko traceback.
"""

from __future__ import annotations

import io
import math
import select
import shlex
import socket
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypedDict

import paramiko
from pydantic import BaseModel
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from runner.core.archives import extract
from runner.core.errors import RunnerError
from runner.lab.host_key import known_hosts_name, pinned_key, refused
from runner.lab.state import LabState

# What a dropped or refused SSH connection raises from inside Paramiko.
CONNECTION_ERRORS = (OSError, socket.timeout, paramiko.SSHException, EOFError)
_CHUNK = 1 << 20
# The longest a read loop sleeps on a quiet channel before it looks at its deadlines again.
_TICK_SECONDS = 1.0
# Each step of reaching a guest (a guest starved of CPU under TCG can accept and then stall).
_STEP_SECONDS = 60.0
# After a command's exit status: how long its output may take to reach its end (EOF).
_DRAIN_SECONDS = 10.0
_BANNER = b"SSH-"
_BANNER_PROBE_SECONDS = 30.0


class ParamikoWaits(TypedDict):
    """Paramiko's waits within one connection, for every SSH client of a guest (this transport
    and pyinfra's connector): a guest starved of CPU under TCG can accept a connection and then
    take longer than Paramiko's default 15 s to send its banner."""

    banner_timeout: float
    auth_timeout: float
    channel_timeout: float


PARAMIKO_WAITS = ParamikoWaits(
    banner_timeout=_STEP_SECONDS, auth_timeout=_STEP_SECONDS, channel_timeout=_STEP_SECONDS
)


class ExecResult(BaseModel):
    command: str
    exit_code: int | None  # None: the deadline passed before the command ended
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class GuestError(RunnerError):
    """The guest did not answer, or a command in it failed where failure is not an outcome."""


class GuestTransport(Protocol):
    """What the runner needs of a connection to the guest."""

    def connect(self, wait_seconds: float = 0) -> Self: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def exec(
        self, command: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        """Run ``command`` with bash; exit_code None when ``timeout`` passed first."""
        ...

    def check(self, command: str, *, timeout: float | None = None) -> ExecResult:
        """``exec``, raising ``GuestError`` unless the command exited 0."""
        ...

    def holding(
        self, command: str, ready: bytes, wait_seconds: float
    ) -> AbstractContextManager[None]:
        """``command`` running from when it printed ``ready`` until the context ends."""
        ...

    def upload(self, local: Path, remote_dir: str) -> None: ...

    def download(self, remote_dir: str, local_parent: Path) -> Path:
        """Copy a remote directory tree under ``local_parent``; returns the local copy."""
        ...


@contextmanager
def connection_errors(guest: str, doing: str) -> Iterator[None]:
    """Paramiko's and the socket's errors as one ``GuestError`` line. ``doing`` must not quote
    the command: a cell's Harbor command carries its bearer."""
    try:
        yield
    except CONNECTION_ERRORS as error:
        detail = str(error) or type(error).__name__
        raise GuestError(f"guest at {guest}: {doing}: {detail}") from None


def require_ok(result: ExecResult) -> ExecResult:
    """The ``check`` of every transport: a failed command becomes a ``GuestError``."""
    if not result.ok:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise GuestError(
            f"guest command failed ({result.exit_code}): {result.command}: {detail[0]}"
        )
    return result


class Channel(Protocol):
    """The part of ``paramiko.Channel`` that reading a command's output uses."""

    eof_received: int  # paramiko sets it on the peer's EOF (its stubs say int: 0 or 1)
    closed: bool
    status_event: threading.Event  # set when the exit status arrived (or the channel closed)

    def fileno(self) -> int: ...
    def recv_ready(self) -> bool: ...
    def recv(self, nbytes: int) -> bytes: ...
    def recv_stderr_ready(self) -> bool: ...
    def recv_stderr(self, nbytes: int) -> bytes: ...
    def exit_status_ready(self) -> bool: ...
    def recv_exit_status(self) -> int: ...
    def close(self) -> None: ...


def _await_channel(channel: Channel, seconds: float) -> None:
    """Sleep until the channel has something new, or ``seconds`` (at most _TICK_SECONDS) pass.
    Paramiko's ``fileno`` is readable while either output stream holds data and for good after
    EOF or close; after those only the exit status can still come, so its event is awaited."""
    seconds = max(0.0, min(seconds, _TICK_SECONDS))
    if channel.eof_received or channel.closed:
        channel.status_event.wait(seconds)
    else:
        select.select([channel], [], [], seconds)


def read_channel(
    channel: Channel, timeout: float | None, clock: Callable[[], float] = time.monotonic
) -> tuple[int | None, bytes, bytes]:
    """(exit code, stdout, stderr) of a command; exit code None when ``timeout`` seconds passed
    before it exited (the channel is then closed). A command's output is complete at its exit
    status and its EOF both: OpenSSH sends the exit status as soon as the command exits and
    drains its pipes after (a listing of the guest's firewall was once cut at 8,192 bytes so,
    commit 9aaea26); after the exit status the rest is awaited for at most _DRAIN_SECONDS,
    should something the command started keep its output open. One chunk of each stream is read
    per turn, so the deadlines are looked at even while a command prints without end."""
    deadline = math.inf if timeout is None else clock() + timeout
    drained_by = math.inf
    stdout, stderr = bytearray(), bytearray()
    while True:
        # Looked at before reading: EOF (or the close) and the exit status follow all output.
        complete = channel.exit_status_ready() and (channel.eof_received or channel.closed)
        read = False
        if channel.recv_ready():
            stdout += channel.recv(_CHUNK)
            read = True
        if channel.recv_stderr_ready():
            stderr += channel.recv_stderr(_CHUNK)
            read = True
        now = clock()
        if complete and not read:
            break
        if channel.exit_status_ready():
            drained_by = min(drained_by, now + _DRAIN_SECONDS)
            if now > drained_by:
                break
        elif now > deadline:
            channel.close()
            return None, bytes(stdout), bytes(stderr)
        if not read:
            _await_channel(channel, min(deadline, drained_by) - now)
    return channel.recv_exit_status(), bytes(stdout), bytes(stderr)


def _await_output(channel: paramiko.Channel, ready: bytes, wait_seconds: float) -> None:
    deadline = time.monotonic() + wait_seconds
    seen, stderr = bytearray(), bytearray()
    while ready not in seen:
        if channel.exit_status_ready() and not channel.recv_ready():
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(_CHUNK)
            last = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise GuestError(f"a held command ended early ({channel.recv_exit_status()}): {last}")
        if time.monotonic() > deadline:
            channel.close()
            raise GuestError(f"a held command did not print {ready.decode()} in time")
        if channel.recv_ready():
            seen += channel.recv(_CHUNK)
        else:
            _await_channel(channel, deadline - time.monotonic())


class ClosedOnExit(ABC):
    """``with transport:`` closes it: the part every transport shares."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class SshTransport(ClosedOnExit):
    """``GuestTransport`` over Paramiko SSH, refusing any host key but the lab's pinned one."""

    def __init__(self, lab: LabState) -> None:
        self.lab = lab
        self.host, self.port, self.user = lab.ssh_host, lab.ssh_port, lab.ssh_user
        self.key_path = Path(lab.private_key)
        self.host_key = pinned_key(lab)
        self._client: paramiko.SSHClient | None = None

    @classmethod
    def for_lab(cls, lab: LabState) -> SshTransport:
        """The one way a transport to a lab's guest is made: from its lab.json."""
        return cls(lab)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def connect(self, wait_seconds: float = 0) -> Self:
        """Connect, retrying for up to ``wait_seconds`` while the guest boots; a guest that
        offers another host key is refused at once (``HostKeyError``), never retried."""

        @retry(
            retry=retry_if_exception_type(CONNECTION_ERRORS),
            stop=stop_after_delay(wait_seconds),
            wait=wait_fixed(2),
            reraise=True,
        )
        def attempt() -> paramiko.SSHClient:
            client = paramiko.SSHClient()
            client.get_host_keys().add(
                known_hosts_name(self.lab), self.host_key.get_name(), self.host_key
            )
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                client.connect(
                    self.host,
                    port=self.port,
                    username=self.user,
                    key_filename=str(self.key_path),
                    timeout=10,
                    **PARAMIKO_WAITS,
                    allow_agent=False,
                    look_for_keys=False,
                )
            except paramiko.BadHostKeyException as error:
                client.close()
                raise refused(self.lab, error.key) from None
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(15)
            return client

        with connection_errors(self.address, "did not answer SSH"):
            self._client = attempt()
        return self

    @property
    def client(self) -> paramiko.SSHClient:
        if self._client is None:
            raise GuestError(f"not connected to the guest at {self.address}")
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestError(f"the SSH connection to the guest at {self.address} is closed")
        channel = transport.open_session(window_size=16 * _CHUNK, max_packet_size=32768)
        channel.exec_command(command)
        return channel

    def exec(
        self, command: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        """Run ``command`` with bash. At ``timeout`` the channel is closed and exit_code is None;
        killing what the command started is the caller's job (it knows the process group)."""
        started = time.monotonic()
        with connection_errors(self.address, "running a command"):
            channel = self._channel(f"bash -c {shlex.quote(command)}")
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            code, stdout, stderr = read_channel(channel, timeout)
        return ExecResult(
            command=command,
            exit_code=code,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            seconds=round(time.monotonic() - started, 3),
        )

    def check(self, command: str, *, timeout: float | None = None) -> ExecResult:
        return require_ok(self.exec(command, timeout=timeout))

    @contextmanager
    def holding(self, command: str, ready: bytes, wait_seconds: float) -> Iterator[None]:
        """Run ``command`` until it prints ``ready``; it goes on while the context lasts, then
        its stdin is closed (its cue to finish) and its exit is awaited."""
        with connection_errors(self.address, "starting a held command"):
            channel = self._channel(f"bash -c {shlex.quote(command)}")
        try:
            with connection_errors(self.address, "waiting for a held command"):
                _await_output(channel, ready, wait_seconds)
            yield
        finally:
            with connection_errors(self.address, "ending a held command"):
                channel.shutdown_write()
                code, _, stderr = read_channel(channel, wait_seconds)
        if code != 0:
            last = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise GuestError(f"guest at {self.address}: a held command ended with {code}: {last}")

    def upload(self, local: Path, remote_dir: str) -> None:
        """Copy a file or directory tree into ``remote_dir`` as one tar stream."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(local, arcname=local.name)
        quoted = shlex.quote(remote_dir)
        self.check_stdin(f"mkdir -p {quoted} && tar -x -C {quoted}", buffer.getvalue())

    def check_stdin(self, command: str, data: bytes) -> None:
        result = self.exec(command, stdin=data)
        if not result.ok:
            raise GuestError(f"guest command failed ({result.exit_code}): {command}")

    def download(self, remote_dir: str, local_parent: Path) -> Path:
        """Copy a remote directory tree under ``local_parent``; returns the local copy."""
        parent, name = remote_dir.rstrip("/").rsplit("/", 1)
        with connection_errors(self.address, f"copying {remote_dir} back"):
            channel = self._channel(f"tar -c -C {shlex.quote(parent or '/')} {shlex.quote(name)}")
            channel.shutdown_write()
            data = bytearray()
            while chunk := channel.recv(_CHUNK):
                data += chunk
            status = channel.recv_exit_status()
        if status != 0:
            raise GuestError(f"could not copy {remote_dir} from the guest")
        local_parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r") as archive:
            extract(archive, local_parent)
        return local_parent / name


def wait_for_sshd(lab: LabState, wait_seconds: float, poll_seconds: float = 0.05) -> None:
    """Wait up to ``wait_seconds`` for the guest's sshd to send its banner through QEMU's port
    forward: QEMU accepts on the host port itself even while the guest does not listen (or
    runs at all), so only the banner says the guest answers. Probing it first also keeps
    Paramiko, which logs a traceback per refused handshake, out of a boot wait."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with socket.create_connection((lab.ssh_host, lab.ssh_port), timeout=5) as probe:
                # A guest that does not listen closes at once; one that listens may be slow to
                # start the session's sshd under TCG on a busy host (seconds, not minutes).
                probe.settimeout(_BANNER_PROBE_SECONDS)
                if probe.recv(len(_BANNER)) == _BANNER:
                    return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise GuestError(f"the guest's sshd did not answer on {lab.ssh_host}:{lab.ssh_port}")
        time.sleep(poll_seconds)


def guest_machine(lab: LabState, wait_seconds: float = 0) -> str:
    """The guest's ``uname -m`` over SSH, waiting up to ``wait_seconds`` for its sshd; every
    step is bounded, so this never hangs."""
    wait_for_sshd(lab, wait_seconds, poll_seconds=2.0)
    # Its sshd answered: a handshake dropped now is the guest being slow, tried again a while.
    with SshTransport.for_lab(lab).connect(max(wait_seconds, _STEP_SECONDS)) as guest:
        return guest.check("uname -m", timeout=_STEP_SECONDS).stdout.strip()
