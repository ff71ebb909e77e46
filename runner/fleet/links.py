"""The controller pulling a cell's files from the host that ran it, into its own run directory.

A cell's trial tree, proxy record and attempt records stay in its host's staging run directory
until the controller pulls them here: Temporal carries only the list (paths and sha256), never
the files, so the server's history stays small and holds no agent output. A host on this machine
(no ``ssh`` in the fleet file) is read from its path; a remote one over SFTP, as the fleet file's
``user@hostname`` with the controller's SSH agent or default keys. Each file is checked against
its sha256 before it is written (atomically, fsynced); a file that does not match is an error,
and the cell is not counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Protocol

import paramiko

from runner.core.errors import RunnerError
from runner.core.files import write_atomic
from runner.records.ledger import RetainedFile
from runner.spec.fleet import FleetHost


class HostFiles(Protocol):
    def read(self, path: str) -> bytes: ...


class LocalFiles:
    def read(self, path: str) -> bytes:
        return Path(path).read_bytes()


class SftpFiles:
    def __init__(self, sftp: paramiko.SFTPClient) -> None:
        self._sftp = sftp

    def read(self, path: str) -> bytes:
        with self._sftp.open(path, "rb") as handle:
            return bytes(handle.read())


@contextmanager
def host_files(host: FleetHost) -> Iterator[HostFiles]:
    if host.ssh is None:
        yield LocalFiles()
        return
    user, _, hostname = host.ssh.rpartition("@")
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(hostname, username=user or None)
        with client.open_sftp() as sftp:
            yield SftpFiles(sftp)
    except (OSError, paramiko.SSHException) as error:
        raise RunnerError(f"host {host.name} ({host.ssh}): {error}") from None
    finally:
        client.close()


def pull_files(
    host: FleetHost, staging: str, files: tuple[RetainedFile, ...], run_dir: Path
) -> None:
    """Each file from the host's ``staging`` directory to the same path under ``run_dir``."""
    with host_files(host) as source:
        for retained in files:
            data = source.read(str(PurePosixPath(staging) / retained.path))
            found = "sha256:" + hashlib.sha256(data).hexdigest()
            if found != retained.sha256:
                raise RunnerError(
                    f"host {host.name}: {retained.path} is {found}, not the {retained.sha256} "
                    "it reported"
                )
            write_atomic(run_dir / retained.path, data)
