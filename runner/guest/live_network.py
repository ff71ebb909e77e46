"""Runs INSIDE the guest (python3 -I, the neighbour states recorded as argv[1]): the network
configuration as the kernel holds it, one ``key<TAB>value`` line each (runner.freeze.live's
``network`` category): links with their kind and state, addresses, the routes of every table,
the policy rules, the permanent neighbours, each link's traffic control (queueing disciplines,
classes and filters: a netem delay or a rate limit is felt by every packet), the resolver's
effective servers.

Each value is the canonical JSON of what ``ip -j`` or ``tc -j`` said, without the fields that
count down or move by themselves (address and route lifetimes, a neighbour's timers,
statistics). Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

# Fields of ip's and tc's JSON that move by themselves: lifetimes counting down, timers,
# counters (a queueing discipline's reference count among them).
VOLATILE = frozenset(
    {
        "valid_life_time",
        "preferred_life_time",
        "expires",
        "used",
        "confirmed",
        "updated",
        "probes",
        "stats",
        "stats64",
        "refcnt",
    }
)


def ip(*args: str, tool: str = "ip") -> list[dict[str, Any]]:
    done = subprocess.run([tool, "-j", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return []
    parsed = json.loads(done.stdout)
    return [item for item in parsed if isinstance(item, dict)]


def clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def main() -> None:
    states = {s for s in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if s}
    out: dict[str, str] = {}

    def put(key: str, value: Any) -> None:
        unique, rank = key, 1
        while unique in out:
            rank += 1
            unique = f"{key}#{rank}"
        text = value if isinstance(value, str) else json.dumps(clean(value), sort_keys=True)
        out[unique] = text.replace("\t", " ").replace("\n", " ")

    links = ip("-d", "link", "show")
    for link in links:
        put(f"link:{link.get('ifname')}", link)
    for owner in ip("addr", "show"):
        for address in owner.get("addr_info", []):
            local = f"{address.get('local')}/{address.get('prefixlen')}"
            put(f"addr:{owner.get('ifname')}:{local}", address)
    for family in ("4", "6"):
        for route in ip(f"-{family}", "route", "show", "table", "all"):
            fields = (("table", "main"), ("type", "unicast"), ("dst", ""))
            where = ":".join(str(route.get(field, default)) for field, default in fields)
            put(f"route:{family}:{where}:{route.get('dev', '')}:{route.get('metric', 0)}", route)
        for rule in ip(f"-{family}", "rule", "show"):
            put(f"rule:{family}:{rule.get('priority')}", rule)
    for device in [str(link.get("ifname")) for link in links] if shutil.which("tc") else []:
        for kind in ("qdisc", "class", "filter"):
            for entry in ip(kind, "show", "dev", device, tool="tc"):
                put(f"tc:{device}:{kind}:{entry.get('handle', entry.get('pref', ''))}", entry)
    for neighbour in ip("neigh", "show", "nud", "all"):
        if {state.lower() for state in neighbour.get("state", [])} & states:
            put(f"neigh:{neighbour.get('dev')}:{neighbour.get('dst')}", neighbour)
    if os.path.exists("/etc/resolv.conf"):
        with open("/etc/resolv.conf", errors="replace") as handle:
            for line in handle:
                words = line.split()
                if words and words[0] in ("nameserver", "search", "domain", "options"):
                    put(f"resolv:{words[0]}", " ".join(words[1:]))
    if shutil.which("resolvectl"):
        done = subprocess.run(["resolvectl", "dns"], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines() if done.returncode == 0 else []:
            where, _, servers = line.partition(":")
            put(f"resolved:{where.strip()}", servers.strip())
    for key in sorted(out):
        print(f"{key}\t{out[key]}")


if __name__ == "__main__":
    main()
