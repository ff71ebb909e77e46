"""The narrow transport to the guest: connect, exec, upload, download, over Paramiko SSH.

Everything the runner does inside the guest goes through ``GuestTransport``; ``exec`` returns
an ``ExecResult`` model. Directory trees travel as tar streams over one exec channel (one round
trip, no per-file SFTP requests).
"""

from __future__ import annotations

import io
import shlex
import socket
import tarfile
import time
from pathlib import Path
from types import TracebackType

import paramiko
from pydantic import BaseModel
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from runner.core.errors import RunnerError

_CONNECT_ERRORS = (OSError, socket.timeout, paramiko.SSHException, EOFError)
_CHUNK = 1 << 20


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


class GuestTransport:
    def __init__(self, host: str, port: int, key_path: Path, user: str = "root") -> None:
        self.host, self.port, self.key_path, self.user = host, port, key_path, user
        self._client: paramiko.SSHClient | None = None

    def connect(self, wait_seconds: float = 0) -> GuestTransport:
        """Connect, retrying for up to ``wait_seconds`` while the guest boots."""

        @retry(
            retry=retry_if_exception_type(_CONNECT_ERRORS),
            stop=stop_after_delay(wait_seconds),
            wait=wait_fixed(2),
            reraise=True,
        )
        def attempt() -> paramiko.SSHClient:
            client = paramiko.SSHClient()
            # The lab's host key is generated at the guest's first boot; the port is loopback-only.
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=str(self.key_path),
                timeout=10,
                banner_timeout=30,
                auth_timeout=30,
                allow_agent=False,
                look_for_keys=False,
            )
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(15)
            return client

        try:
            self._client = attempt()
        except _CONNECT_ERRORS as error:
            raise GuestError(
                f"guest at {self.host}:{self.port} did not answer SSH: {error}"
            ) from None
        return self

    @property
    def client(self) -> paramiko.SSHClient:
        if self._client is None:
            raise GuestError("not connected to the guest")
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> GuestTransport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestError("the SSH connection to the guest is closed")
        channel = transport.open_session(window_size=16 * _CHUNK, max_packet_size=32768)
        channel.exec_command(command)
        return channel

    def exec(
        self, command: str, *, timeout: float | None = None, stdin: bytes | None = None
    ) -> ExecResult:
        """Run ``command`` with bash. At ``timeout`` the channel is closed and exit_code is None;
        killing what the command started is the caller's job (it knows the process group)."""
        started = time.monotonic()
        channel = self._channel(f"bash -c {shlex.quote(command)}")
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        stdout, stderr = bytearray(), bytearray()
        while True:
            if channel.recv_ready():
                stdout += channel.recv(_CHUNK)
            elif channel.recv_stderr_ready():
                stderr += channel.recv_stderr(_CHUNK)
            elif channel.exit_status_ready():
                break
            elif timeout is not None and time.monotonic() - started > timeout:
                channel.close()
                return self._result(command, None, stdout, stderr, started)
            else:
                time.sleep(0.02)
        while channel.recv_ready():
            stdout += channel.recv(_CHUNK)
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(_CHUNK)
        return self._result(command, channel.recv_exit_status(), stdout, stderr, started)

    @staticmethod
    def _result(
        command: str, code: int | None, stdout: bytearray, stderr: bytearray, started: float
    ) -> ExecResult:
        return ExecResult(
            command=command,
            exit_code=code,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            seconds=round(time.monotonic() - started, 3),
        )

    def check(self, command: str, *, timeout: float | None = None) -> ExecResult:
        result = self.exec(command, timeout=timeout)
        if not result.ok:
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise GuestError(f"guest command failed ({result.exit_code}): {command}: {detail[0]}")
        return result

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
        channel = self._channel(f"tar -c -C {shlex.quote(parent or '/')} {shlex.quote(name)}")
        channel.shutdown_write()
        data = bytearray()
        while chunk := channel.recv(_CHUNK):
            data += chunk
        if channel.recv_exit_status() != 0:
            raise GuestError(f"could not copy {remote_dir} from the guest")
        local_parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r") as archive:
            archive.extractall(local_parent, filter="data")
        return local_parent / name
