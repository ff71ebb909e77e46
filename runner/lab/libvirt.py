"""The libvirt boundary: connections, look-ups, and libvirt's error codes translated here.

Everything above this module sees "absent" as ``None`` (never a ``libvirtError`` whose code
must be inspected) and an unreachable daemon as one ``LibvirtUnreachable`` line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import libvirt

from runner.core.errors import RunnerError

# Namespace of our <metadata> element: a domain carrying it is a lab domain, and only those are
# ever changed or removed by this tool.
LAB_NAMESPACE = "https://frozen-bench-runner.invalid/xmlns/lab/1"
LAB_NAMESPACE_PREFIX = "lab"

T = TypeVar("T")

_ABSENT_CODES = frozenset(
    {
        libvirt.VIR_ERR_NO_DOMAIN,
        libvirt.VIR_ERR_NO_STORAGE_POOL,
        libvirt.VIR_ERR_NO_STORAGE_VOL,
        libvirt.VIR_ERR_NO_DOMAIN_METADATA,
    }
)


def _quiet(_context: Any, _error: Any) -> None:
    """libvirt prints every error to stderr by default; ours are raised and handled instead."""


libvirt.registerErrorHandler(_quiet, None)


class LibvirtUnreachable(RunnerError):
    """The libvirt daemon at a URI cannot be reached (not running, wrong URI, no permission)."""


_connections: dict[str, libvirt.virConnect] = {}


def connect(uri: str) -> libvirt.virConnect:
    """One connection per URI for the process (``test:///default`` state lives in it)."""
    connection = _connections.get(uri)
    if connection is not None and connection.isAlive():
        return connection
    try:
        connection = libvirt.open(uri)
    except libvirt.libvirtError as error:
        raise LibvirtUnreachable(f"cannot reach libvirt at {uri}: {error}") from None
    _connections[uri] = connection
    return connection


def _absent_is_none(lookup: Callable[..., T], *args: Any) -> T | None:
    try:
        return lookup(*args)
    except libvirt.libvirtError as error:
        if error.get_error_code() in _ABSENT_CODES:
            return None
        raise


def find_domain(conn: libvirt.virConnect, name: str) -> libvirt.virDomain | None:
    return _absent_is_none(conn.lookupByName, name)


def find_pool(conn: libvirt.virConnect, name: str) -> libvirt.virStoragePool | None:
    return _absent_is_none(conn.storagePoolLookupByName, name)


def find_volume(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    if not pool.isActive():
        return None
    return _absent_is_none(pool.storageVolLookupByName, name)


def download_volume(conn: libvirt.virConnect, pool_name: str, name: str) -> bytes:
    """The whole content of a file in a pool, through libvirt (a remote hypervisor's too); the
    pool is refreshed first, so a file libvirt did not create (the console log) is a volume."""
    pool = conn.storagePoolLookupByName(pool_name)
    pool.refresh(0)
    volume = pool.storageVolLookupByName(name)
    stream = conn.newStream(0)
    chunks: list[bytes] = []
    try:
        volume.download(stream, 0, 0, 0)
        stream.recvAll(lambda _stream, data, received: received.append(data), chunks)
        stream.finish()
    except BaseException:
        stream.abort()
        raise
    return b"".join(chunks)


def lab_metadata(domain: libvirt.virDomain, live: bool) -> str | None:
    """Our <lab:lab> element as XML text, or None when the domain is not one of ours."""
    flags = libvirt.VIR_DOMAIN_AFFECT_LIVE if live else libvirt.VIR_DOMAIN_AFFECT_CONFIG
    metadata: str | None = _absent_is_none(
        domain.metadata, libvirt.VIR_DOMAIN_METADATA_ELEMENT, LAB_NAMESPACE, flags
    )
    return metadata


DOMAIN_STATES: dict[int, str] = {
    libvirt.VIR_DOMAIN_NOSTATE: "nostate",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "blocked",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "shutdown",
    libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
    libvirt.VIR_DOMAIN_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended",
}


def domain_state(domain: libvirt.virDomain) -> str:
    state, _reason = domain.state()
    return DOMAIN_STATES.get(state, "nostate")
