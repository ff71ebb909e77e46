"""The guest's egress firewall: what may leave the guest, and the record of what was refused.

The guest deploy installs ``ruleset()`` as /etc/nftables.conf (Debian's nftables.service loads
it at every boot, before the network; the freeze snapshot keeps it loaded). It lets out only
loopback, the host's proxy and package mirror (QEMU guestfwd addresses), the link's own upkeep
(DHCP with QEMU's user network, IPv6 neighbour discovery), the guest's sshd answering the host,
replies to connections made to the guest, and traffic that stays inside the guest (to and
between Podman's bridges). Every other packet the guest sends (hook ``output``) or forwards for
a task container (hook ``forward``, from a Podman bridge) is counted per destination in a
dynamic set, logged (rate-limited, to the kernel log), and refused.

Refused, not silently dropped: a TCP attempt gets a reset, anything else an ICMP port
unreachable (a guest process's own UDP send fails at once with EPERM), so a harness that tries
fails at once, as a lookup without a resolver did before, instead of waiting out a timeout
inside the cell's deadline.

Name lookups: the guest's resolver is ``127.0.0.53`` (``RESOLV_CONF``), a loopback address where
nothing listens, and task containers get ``192.0.2.53`` (TEST-NET-1, routed nowhere) from
Podman's containers.conf; the firewall refuses and records both, so a lookup is an attempt on
the record (``udp 127.0.0.53:53``) rather than a failure nobody sees. Without the ruleset the
first never leaves loopback, and the second goes nowhere: QEMU's user network is
``restrict=on`` (the second wall); no query reaches a real resolver.

Per cell, the runner empties the sets as the cell starts (``RESET_COMMAND``, in the Harbor
command) and reads them after it (``READ_COMMAND``): ``parse_refused`` turns ``nft -j``'s
listing into the ``RefusedEgress`` entries of the cell's ledger line.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from runner.core.errors import RunnerError
from runner.core.models import FrozenModel
from runner.lab.layout import GUEST_MIRROR_ADDRESS, GUEST_PROXY_ADDRESS

TABLE = "bench_egress"
RULESET_PATH = "/etc/nftables.conf"
# Where lookups go to be refused and recorded: the guest's own (loopback) and the containers'.
GUEST_RESOLVER = "127.0.0.53"
CONTAINER_RESOLVER = "192.0.2.53"
RESOLV_CONF = (
    "# The benchmark guest has no route to the internet by design. Lookups go to a loopback\n"
    "# address where nothing listens; the egress firewall (/etc/nftables.conf) refuses and\n"
    "# records each one, so a lookup is evidence, not a silent failure.\n"
    f"nameserver {GUEST_RESOLVER}\n"
    "options attempts:1\n"
)
# The task containers' base /etc/hosts (Podman's base_hosts_file; image builds read it too).
CONTAINER_HOSTS_PATH = "/etc/containers/bench-hosts"
# The [containers] table of Podman's containers.conf drop-in (the deploy adds its [engine]):
# without it a container gets Google's resolvers when the guest's are loopback-only.
CONTAINERS_DNS_CONF = (
    f'[containers]\ndns_servers = ["{CONTAINER_RESOLVER}"]\n'
    f'base_hosts_file = "{CONTAINER_HOSTS_PATH}"\n'
)


def container_hosts(debian_mirror: str) -> str:
    """The task containers' base /etc/hosts: the lock's Debian mirror's host name is the lab's
    mirror, so a sources line a task adds for it (a ``deb-src`` for ``apt-get source``) is
    answered from the frozen set, or recorded by ``runner resolve LOCK --lab LAB``; every other
    name still goes to the recorded sink."""
    host = urlsplit(debian_mirror).hostname
    mirror = GUEST_MIRROR_ADDRESS.rsplit(":", 1)[0]
    return (
        "# The benchmark's task containers: the Debian mirror's name is the lab's package mirror.\n"
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{mirror}\t{host}\n"
    )


LOG_PREFIX = "bench-egress refused"

# Who sent it: the guest's own processes (the output hook) or a task container (forward).
Source = Literal["guest", "container"]
# One set per source and address family, named <source>_v4, <source>_v6.
_SETS = tuple(f"{source}_v{family}" for source in ("guest", "container") for family in (4, 6))
_PORTED = ("tcp", "udp")


def _allowed(address: str) -> str:
    host, port = address.rsplit(":", 1)
    return f"ip daddr {host} tcp dport {port} accept"


def _refusing_chain(source: Source) -> str:
    """Log (at most 10 a second: the counters are complete, the log need not be), count per
    destination (protocols without ports under port 0), refuse."""
    updates = []
    for family, address in (("4", "ip daddr"), ("6", "ip6 daddr")):
        nfproto = "ipv4" if family == "4" else "ipv6"
        target = f"@{source}_v{family}"
        updates += [
            f"meta nfproto {nfproto} meta l4proto {{ tcp, udp }} "
            f"update {target} {{ {address} . meta l4proto . th dport }}",
            f"meta nfproto {nfproto} meta l4proto != {{ tcp, udp }} "
            f"update {target} {{ {address} . meta l4proto . 0 }}",
        ]
    lines = [
        f'limit rate 10/second burst 20 packets log prefix "{LOG_PREFIX} ({source}): " level warn',
        "counter name refused",
        *updates,
        "meta l4proto tcp reject with tcp reset",
        "reject",
    ]
    body = "".join(f"\t\t{line}\n" for line in lines)
    return f"\tchain refused_{source} {{\n{body}\t}}\n"


def _set(name: str) -> str:
    address = "ipv6_addr" if name.endswith("_v6") else "ipv4_addr"
    return (
        f"\tset {name} {{\n\t\ttype {address} . inet_proto . inet_service\n"
        "\t\tsize 65535\n\t\tflags dynamic\n\t\tcounter\n\t}\n"
    )


def ruleset() -> str:
    """/etc/nftables.conf: this table only. Debian's default file starts with ``flush ruleset``,
    which would also remove Podman's (netavark's) table whenever the file is loaded again."""
    allowed = [_allowed(GUEST_PROXY_ADDRESS), _allowed(GUEST_MIRROR_ADDRESS)]
    output = [
        # The guest's sshd answering the host (QEMU's hostfwd) by its port, not only by
        # conntrack: a session open when the ruleset first loads (the deploy's own) is new to
        # conntrack, and would be refused.
        "tcp sport 22 accept",
        "ct state established,related accept",
        f"oif lo ip daddr {GUEST_RESOLVER} goto refused_guest",
        "oif lo accept",
        'oifname "podman*" accept',
        "udp sport 68 udp dport 67 accept",
        "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert, "
        "mld-listener-report, mld2-listener-report } accept",
        *allowed,
        "goto refused_guest",
    ]
    forward = [
        "ct state established,related accept",
        'iifname "podman*" oifname "podman*" accept',
        *allowed,
        "goto refused_container",
    ]

    def base(name: str, rules: list[str]) -> str:
        body = "".join(f"\t\t{rule}\n" for rule in rules)
        hook = f"\t\ttype filter hook {name} priority filter; policy accept;\n"
        return f"\tchain {name} {{\n{hook}{body}\t}}\n"

    return (
        "#!/usr/sbin/nft -f\n"
        "# The benchmark guest's egress firewall, written by the guest deploy from\n"
        "# runner/lab/egress.py (its docstring says what passes and why). Replaces this table\n"
        "# only: Podman's own tables stay.\n"
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n\n"
        f"table inet {TABLE} {{\n"
        "\tcounter refused {\n\t}\n\n"
        + "".join(_set(name) for name in _SETS)
        + "\n"
        + base("output", output)
        + base("forward", forward)
        + _refusing_chain("guest")
        + _refusing_chain("container")
        + "}\n"
    )


# Empties the record as a cell starts: the sets, and the total counter beside them. Quiet and
# never failing: a guest without the table is found by the read after the cell.
_RESET = "; ".join(
    [*(f"flush set inet {TABLE} {name}" for name in _SETS), f"reset counter inet {TABLE} refused"]
)
RESET_COMMAND = f"nft {shlex.quote(_RESET)} >/dev/null 2>&1"
READ_COMMAND = f"nft -j list table inet {TABLE}"


class RefusedEgress(FrozenModel):
    """Packets to one destination that the guest's firewall refused during a cell."""

    source: Source  # the guest's own process, or a task container's (forwarded)
    proto: str  # as nft names it: tcp, udp, icmp, ...
    address: str
    port: int | None = Field(default=None, ge=0, le=65535)  # None: a protocol without ports
    packets: int = Field(ge=1)

    @property
    def label(self) -> str:
        """``udp 127.0.0.53:53 x2 (guest)``."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        where = f"{host}:{self.port}" if self.port is not None else host
        return f"{self.proto} {where} x{self.packets} ({self.source})"


class EgressReadError(RunnerError):
    """The guest's answer to ``READ_COMMAND`` is not the firewall's listing."""


def _object(found: dict[str, Any], kind: str) -> dict[str, Any] | None:
    value = found.get(kind)
    return value if isinstance(value, dict) and value.get("table") == TABLE else None


def parse_refused(listing: str) -> tuple[RefusedEgress, ...]:
    """What ``nft -j list table inet bench_egress`` shows was refused: one entry per source,
    protocol and destination, ordered; a listing without the table's sets is an error (the
    firewall is not the one the deploy installed)."""
    try:
        objects = json.loads(listing)["nftables"]
    except (ValueError, KeyError, TypeError) as error:
        raise EgressReadError(f"the guest's firewall listing is not nft JSON: {error}") from None
    sets = {
        found["name"]: found
        for item in objects
        if isinstance(item, dict) and (found := _object(item, "set")) is not None
    }
    missing = [name for name in _SETS if name not in sets]
    if missing:
        raise EgressReadError(f"the guest's firewall has no set {missing[0]} in table {TABLE}")
    counts: dict[tuple[Source, str, str, int | None], int] = {}
    for name in _SETS:
        source: Source = "guest" if name.startswith("guest") else "container"
        for element in sets[name].get("elem", []):
            address, proto, port, packets = _element(element)
            where = (source, proto, address, port if proto in _PORTED else None)
            counts[where] = counts.get(where, 0) + packets
    return tuple(
        RefusedEgress(source=source, proto=proto, address=address, port=port, packets=packets)
        for (source, proto, address, port), packets in sorted(counts.items(), key=_order)
        if packets > 0
    )


def _order(item: tuple[tuple[Source, str, str, int | None], int]) -> tuple[object, ...]:
    (source, proto, address, port), _ = item
    return (source, proto, ipaddress.ip_address(address).packed, port or 0)


def _element(element: object) -> tuple[str, str, int, int]:
    """(address, protocol, port, packets) of one set element as ``nft -j`` prints it:
    ``{"elem": {"val": {"concat": [addr, proto, port]}, "counter": {"packets": n, ...}}}``."""
    try:
        assert isinstance(element, dict)
        body = element["elem"]
        address, proto, port = body["val"]["concat"]
        packets = body["counter"]["packets"]
        ipaddress.ip_address(address)
        return str(address), str(proto), int(port), int(packets)
    except (AssertionError, KeyError, TypeError, ValueError):
        raise EgressReadError(f"unreadable element of the firewall's sets: {element!r}") from None
