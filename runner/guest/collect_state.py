"""Runs INSIDE the guest (python3 from stdin, the scope as argv[1]); prints the state as JSON.

Standalone on purpose: only the standard library of the guest's Python. The output is validated
on the host as ``runner.freeze.manifest.Collected``. The audit computes the same things with
other tools (coreutils, dpkg-query, ss, awk in an Ansible playbook), so a bug here and there
would have to agree to hide a drift.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from typing import Any


def run(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def packages() -> dict[str, str]:
    found: dict[str, str] = {}
    listing = run("dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${binary:Package}\t${Version}\n")
    for line in listing.splitlines():
        status, name, version = line.split("\t")
        status = status.strip()
        if status.startswith("u"):
            continue  # unknown/not-installed: dpkg only remembers the name
        found[name] = version if status == "ii" else f"{version} [{status}]"
    return found


def images() -> list[dict[str, Any]]:
    listed = json.loads(run("podman", "images", "--digests", "--format", "json") or "[]")
    return [
        {
            "id": image["Id"],
            "digest": image.get("Digest") or "",
            "names": sorted(image.get("Names") or []),
        }
        for image in listed
    ]


def listening() -> list[dict[str, Any]]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        low, high = (int(value) for value in handle.read().split())
    sockets = set()
    for line in run("ss", "-Hltnu").splitlines():
        fields = line.split()
        port = int(fields[4].rsplit(":", 1)[1])
        if not low <= port <= high:  # ephemeral: a client's or a resolver's, not a service
            sockets.add((fields[0], port))
    return [{"proto": proto, "port": port} for proto, port in sorted(sockets)]


def nft_tables(tables: list[str]) -> dict[str, str]:
    """Each table's rules as loaded, without counters and set contents (``nft -s -t``): the
    sha256 of nft's listing, or "absent" (not loaded, or no nft)."""
    found: dict[str, str] = {}
    for table in tables:
        found[table] = "absent"
        if shutil.which("nft"):
            command = ["nft", "-s", "-t", "list", "table", *table.split()]
            listed = subprocess.run(command, capture_output=True)
            if listed.returncode == 0:
                found[table] = "sha256:" + hashlib.sha256(listed.stdout).hexdigest()
    return found


def waiting(units: dict[str, str]) -> dict[str, str]:
    """Each unit's main pid (0: not running), and whether its FIFO says it waits for a cell."""
    found = {}
    for unit, fifo in units.items():
        pid = run("systemctl", "show", "-p", "MainPID", "--value", unit).strip() or "0"
        is_fifo = os.path.exists(fifo) and stat.S_ISFIFO(os.stat(fifo).st_mode)
        state = "waiting" if is_fifo else "not waiting"
        found[unit] = f"pid {pid} {state}"
    return found


def main() -> None:
    scope = json.loads(sys.argv[1])
    state = {
        "kernel": os.uname().release,
        "packages": packages(),
        "images": images() if shutil.which("podman") else [],
        "listening": listening(),
        "nft_tables": nft_tables(scope.get("nft_tables", [])),
        "waiting": waiting(scope.get("waiting_units", {})),
    }
    json.dump(state, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
