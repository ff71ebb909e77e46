"""A stand-in guest sshd on 127.0.0.1: Paramiko's server side with a host key the test makes
(this machine has no OpenSSH server). It takes any public key for any user and runs each exec
request with this machine's shell, stdin and both output streams carried, so every client of
a lab (SshTransport, pyinfra's connector, Ansible's ssh) can be pointed at it; ``host_key`` can
be swapped to play a guest whose key changed."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import paramiko

from runner.lab.state import Acceleration, ImageRef, LabState


def make_ed25519_key(path: Path) -> paramiko.Ed25519Key:
    """A new ed25519 key pair at ``path`` (and ``path``.pub), by ssh-keygen as the guest's."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True
    )
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def loopback_lab(lab: str, port: int, private_key: Path, host_key: str | None) -> LabState:
    """A lab whose guest is a loopback sshd on ``port``, pinning ``host_key``."""
    return LabState(
        lab=lab,
        environment_fingerprint="sha256:" + "0" * 64,
        libvirt_uri="test:///default",
        domain_name=f"frozen-bench-{lab}",
        domain_uuid="00000000-0000-0000-0000-000000000000",
        guest_arch="aarch64",
        acceleration=Acceleration(kind="tcg", reason="test"),
        pool_name=f"frozen-bench-{lab}",
        pool_dir="/pools/t",
        overlay_path="/pools/t/o.qcow2",
        console_log="/pools/t/console.log",
        ssh_port=port,
        private_key=str(private_key),
        proxy_port=40080,
        image=ImageRef(store_dir="/images", input_hash="0", root_sha256="sha256:" + "0" * 64),
        ssh_host_key=host_key,
    )


class _AnyKeyServer(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=_run, args=(channel, command.decode()), daemon=True).start()
        return True


def _pump_stdin(channel: paramiko.Channel, stdin: IO[bytes]) -> None:
    with stdin:
        while data := channel.recv(1 << 16):
            stdin.write(data)
            stdin.flush()


def _run(channel: paramiko.Channel, command: str) -> None:
    process = subprocess.Popen(
        command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin and process.stdout and process.stderr
    threading.Thread(target=_pump_stdin, args=(channel, process.stdin), daemon=True).start()
    errors = threading.Thread(
        target=lambda: channel.sendall_stderr(process.stderr.read()),
        daemon=True,  # type: ignore[union-attr]
    )
    errors.start()
    while data := process.stdout.read1(1 << 16):
        channel.sendall(data)
    errors.join()
    # As OpenSSH: the exit status, then EOF and close.
    channel.send_exit_status(process.wait())
    channel.shutdown_write()
    channel.close()


class LoopbackSshd:
    """Accepts connections on a free 127.0.0.1 port until closed; ``host_key`` is read per
    connection, so assigning it changes what the next client is offered. The first
    ``drop_first`` connections are closed before the banner, as a guest's sshd that is starved
    or refusing for a while closes them; ``connections`` counts every connection accepted."""

    def __init__(self, host_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.drop_first = 0
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            self.connections += 1
            if self.connections <= self.drop_first:
                connection.close()
                continue
            transport = paramiko.Transport(connection)
            transport.add_server_key(self.host_key)
            self._transports.append(transport)
            try:
                transport.start_server(server=_AnyKeyServer())
            except (paramiko.SSHException, EOFError, OSError):  # a client that refused us
                transport.close()

    def close(self) -> None:
        self._listener.close()
        for transport in self._transports:
            transport.close()


@contextmanager
def loopback_sshd(host_key: paramiko.PKey) -> Iterator[LoopbackSshd]:
    server = LoopbackSshd(host_key)
    try:
        yield server
    finally:
        server.close()
