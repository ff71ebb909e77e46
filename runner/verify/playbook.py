"""The audit playbook, generated from a freeze manifest: observe the guest's live state, assert
per category. (The disk is audited on the host: runner.verify.disk.)

Every probe observes one kind of state with the guest's own tools (``dpkg-query``, ``podman``,
``ss``, ``nft``, ``systemctl`` and the live categories of runner.freeze.live) and turns what it
saw into a map ``key -> value`` shaped like the manifest's expectation; one ``assert`` per
category compares every key either map has.

Observations are ``raw`` tasks: one SSH exec each, no Python module. Under TCG a Python module
(``stat``, ``command``) costs 7-16 s of interpreter start per call in the guest, a ``raw``
call well under one. The playbook runs in check mode; the read-only observations opt out of
it (``check_mode: false``, ``changed_when: false``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.freeze.live import (
    LATE_CATEGORIES,
    LIVE_PROBES,
    SPEED_COMMAND,
    LiveProbe,
    concurrent_command,
    frame_begin,
    frame_end,
    frame_nonce,
)
from runner.freeze.manifest import FreezeManifest

ABSENT = "absent"
LISTENING = "listening"
CHECK_TASK_PREFIX = "check "
SPEED_TASK = "observe speed"
# The live categories in one task (its duration is the audit's "live" speed figure), the rest
# (packages, images, ports, tables, waiting units) in another.
OBSERVE_LIVE_TASK = "observe the live state"
OBSERVE_REST_TASK = "observe packages images ports"
HOST_GROUP = "guest"
# A real TAB inside Jinja string literals (Ansible escapes backslashes in templates).
TAB = "\t"


@dataclass(frozen=True)
class Probe:
    """One kind of state: the guest command that observes it, the Jinja expression that turns
    the command's registered result ``<category>_seen`` into a map, and the manifest's map."""

    category: str
    command: Callable[[FreezeManifest], str]
    observed: str
    expected: Callable[[FreezeManifest], dict[str, str]]

    @property
    def register(self) -> str:
        return f"{self.category}_seen"


def _raw(name: str, command: str, register: str | None = None) -> dict[str, Any]:
    task: dict[str, Any] = {
        "name": name,
        # Literal: no Jinja in the guest's command (Go templates of podman, bash's ${{...}}).
        "ansible.builtin.raw": f"{{% raw %}}set -o pipefail; {command}{{% endraw %}}",
        "args": {"executable": "/bin/bash"},
        "changed_when": False,
        "check_mode": False,
    }
    if register:
        task["register"] = register
    return task


def _lines_to_map(register: str, maxsplit: int = -1) -> str:
    """``key<TAB>value`` lines to a map (``maxsplit=1``: a value may hold tabs)."""
    return f"{{{{ dict({register}.stdout_lines | map('split', '{TAB}', {maxsplit})) }}}}"


# dpkg's own view, one "name<TAB>version" line per package it knows; the version carries the
# status when it is not "ii" (e.g. "1.2-3 [rc]" after a remove that kept the config files).
_DPKG_QUERY = (
    "dpkg-query -W -f '${db:Status-Abbrev}\\t${binary:Package}\\t${Version}\\n'"
    " | awk -F '\\t' '{ s = $1; gsub(/ /, \"\", s); if (s ~ /^u/) next;"
    ' print $2 "\\t" $3 (s == "ii" ? "" : " [" s "]") }\''
)


_IMAGES_OBSERVED = (
    "{%- set out = {} -%}"
    "{%- for i in podman_seen.stdout | from_json -%}"
    # .get(): Podman leaves Names (and Digest) out of an untagged image's entry.
    "{%- set _ = out.update({i.Id: 'digest=' ~ (i.get('Digest') or '') ~ ' names='"
    " ~ ((i.get('Names') or []) | sort | join(','))}) -%}"
    "{%- endfor -%}{{ out }}"
)


def image_value(digest: str, names: tuple[str, ...]) -> str:
    return f"digest={digest} names={','.join(sorted(names))}"


# Listening TCP and UDP ports outside the ephemeral range, as "tcp/22<TAB>listening". (awk
# reads the range itself: dash's `read` takes one byte of a /proc file.)
_SS_LISTENING = (
    "ss -Hltnu | awk 'NR == FNR { low = $1 + 0; high = $2 + 0; next }"
    ' { n = split($5, a, ":"); p = a[n] + 0;'
    f' if (p < low || p > high) print $1 "/" p "\\t{LISTENING}" }}\''
    " /proc/sys/net/ipv4/ip_local_port_range - | LC_ALL=C sort -u"
)


def _nft_command(manifest: FreezeManifest) -> str:
    """``<family> <name><TAB>sha256:<hex>`` of each frozen table's rules as nft lists them
    without counters and set contents, or ``absent`` (the freeze's collection does the same)."""
    return "true; " + "".join(
        f"if h=$(nft -s -t list table {table} 2>/dev/null | sha256sum | cut -c1-64); "
        f"then printf '%s\\tsha256:%s\\n' {shlex.quote(table)} \"$h\"; "
        f"else printf '%s\\t{ABSENT}\\n' {shlex.quote(table)}; fi; "
        for table in manifest.scope.nft_tables
    )


def _waiting_command(manifest: FreezeManifest) -> str:
    """``<unit><TAB>pid <n> waiting|not waiting`` of each waiting unit (as the freeze collects)."""
    return "true; " + "".join(
        f"pid=$(systemctl show -p MainPID --value {shlex.quote(unit)} 2>/dev/null); "
        f"if [ -p {shlex.quote(fifo)} ]; then state=waiting; else state='not waiting'; fi; "
        f'printf \'%s\\tpid %s %s\\n\' {shlex.quote(unit)} "${{pid:-0}}" "$state"; '
        for unit, fifo in manifest.scope.waiting_units.items()
    )


def _live_probe(live: LiveProbe) -> Probe:
    """A live category (runner.freeze.live): the command the freeze ran, the map it recorded."""
    return Probe(
        live.category,
        lambda m: live.command(m.scope),
        _lines_to_map(f"{live.category}_seen", maxsplit=1),
        lambda m: dict(m.state.live.get(live.category, {})),
    )


PROBES: tuple[Probe, ...] = (
    Probe(
        "kernel",
        lambda m: "printf 'release\\t%s\\n' \"$(uname -r)\"",
        _lines_to_map("kernel_seen"),
        lambda m: {"release": m.state.kernel},
    ),
    Probe(
        "dpkg", lambda m: _DPKG_QUERY, _lines_to_map("dpkg_seen"), lambda m: dict(m.state.packages)
    ),
    Probe(
        "podman",
        lambda m: (
            "if command -v podman >/dev/null; "
            "then podman images --digests --format json; else echo '[]'; fi"
        ),
        _IMAGES_OBSERVED,
        lambda m: {image.id: image_value(image.digest, image.names) for image in m.state.images},
    ),
    Probe(
        "listen",
        lambda m: _SS_LISTENING,
        _lines_to_map("listen_seen"),
        lambda m: {socket.label: LISTENING for socket in m.state.listening},
    ),
    Probe("nft", _nft_command, _lines_to_map("nft_seen"), lambda m: dict(m.state.nft_tables)),
    Probe(
        "waiting",
        _waiting_command,
        _lines_to_map("waiting_seen"),
        lambda m: dict(m.state.waiting),
    ),
    *(_live_probe(live) for live in LIVE_PROBES),
)


def probes_for(manifest: FreezeManifest) -> tuple[Probe, ...]:
    """The probes of ``manifest``'s audit: all, but a live category added after its freeze was
    made (runner.freeze.live.LATE_CATEGORIES), which the audit names instead (audit.py)."""
    return tuple(
        probe
        for probe in PROBES
        if probe.category not in LATE_CATEGORIES or probe.category in manifest.state.live
    )


def _check_task(probe: Probe) -> dict[str, Any]:
    """One assert over every key either map has; its message (on success too) is JSON
    ``{"checked": [keys], "drifts": [{"item", "expected", "found"}]}``. One task rather than
    a loop: a loop item costs ~17 ms of Ansible's time, and dpkg alone has hundreds of keys."""
    expected, observed = f"expected[{probe.category!r}]", f"observed[{probe.category!r}]"
    drifts = (
        "{%- set out = [] -%}{%- for key in check_keys -%}"
        f"{{%- set e = {expected}.get(key, {ABSENT!r}) -%}}"
        f"{{%- set f = {observed}.get(key, {ABSENT!r}) -%}}"
        "{%- if e != f -%}{%- set _ = out.append({'item': key, 'expected': e, 'found': f}) -%}"
        "{%- endif -%}{%- endfor -%}{{ out }}"
    )
    message = "{{ {'checked': check_keys, 'drifts': check_drifts} | to_json }}"
    return {
        "name": f"{CHECK_TASK_PREFIX}{probe.category}",
        "ansible.builtin.assert": {
            "that": "check_drifts | length == 0",
            "fail_msg": message,
            "success_msg": message,
        },
        "vars": {
            "check_keys": f"{{{{ {expected}.keys() | union({observed}.keys()) | sort }}}}",
            "check_drifts": drifts,
        },
        "ignore_errors": True,
    }


def _observe_at_once(
    manifest: FreezeManifest, name: str, probes: tuple[Probe, ...]
) -> list[dict[str, Any]]:
    """One task observing ``probes`` at once (runner.freeze.live.concurrent_command), then each
    probe's part registered as if a task of its own had printed it."""
    nonce = frame_nonce()
    commands = {probe.category: probe.command(manifest) for probe in probes}
    register = name.replace(" ", "_")
    sections = {}
    for probe in probes:
        # framed_sections in Jinja; the frame's real newlines in its literals, as TAB above:
        # Ansible escapes backslashes.
        part = (
            f"({register}.stdout.split('{frame_begin(nonce, probe.category)}', 1)[1]"
            f".split('{frame_end(nonce)}', 1)[0])"
        )
        sections[probe.register] = (
            f"{{{{ {{'stdout': {part}, 'stdout_lines': {part}.splitlines()}} }}}}"
        )
    return [
        _raw(name, concurrent_command(commands, nonce), register),
        {"name": f"what each of {name} printed", "ansible.builtin.set_fact": sections},
    ]


def build_playbook(manifest: FreezeManifest) -> list[dict[str, Any]]:
    """One play against the guest: observe everything, gather the maps, list drifted trees,
    assert per category."""
    probes = probes_for(manifest)
    live_categories = {probe.category for probe in LIVE_PROBES}
    live = tuple(probe for probe in probes if probe.category in live_categories)
    rest = tuple(probe for probe in probes if probe.category not in live_categories)
    gather = {
        "name": "gather what was observed",
        "ansible.builtin.set_fact": {
            "observed": {probe.category: probe.observed for probe in probes},
        },
    }
    # The speed probe, compared with the freeze's figures from its event (audit.py), not here.
    speed = [_raw(SPEED_TASK, SPEED_COMMAND, "speed_seen")] if manifest.state.speed else []
    return [
        {
            "name": f"audit the frozen state (manifest {manifest.sha256})",
            "hosts": HOST_GROUP,
            "gather_facts": False,
            "vars": {"expected": {probe.category: probe.expected(manifest) for probe in probes}},
            "tasks": [
                *speed,
                *_observe_at_once(manifest, OBSERVE_LIVE_TASK, live),
                *_observe_at_once(manifest, OBSERVE_REST_TASK, rest),
                gather,
                *(_check_task(probe) for probe in probes),
            ],
        }
    ]
