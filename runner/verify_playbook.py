"""The audit playbook, generated from a freeze manifest: observe the guest, assert per item.

Every probe observes one kind of state with its own tool (``dpkg-query``, ``stat`` with sha256,
coreutils ``sha256sum`` over a tree listing, ``pip freeze``, ``podman images``, ``ss``), turns
what it saw into a map ``key -> value`` shaped like the manifest's expectation, and one
``assert`` per key of either map says whether they agree. The playbook runs in check mode: the
read-only observations opt out of it (``check_mode: false``, ``changed_when: false``).

An assert's failure message is JSON ``{"expected": ..., "found": ...}``; runner/verify.py reads
it back from the job events. A tree that drifted is listed again, file by file, as evidence for
a per-file diff.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.freeze_manifest import FreezeManifest, FreezeScope

ABSENT = "absent"
CHECK_TASK_PREFIX = "check "
TREE_LISTING_TASK = "list drifted trees"
HOST_GROUP = "guest"

_OBSERVE = {"changed_when": False, "check_mode": False}


@dataclass(frozen=True)
class Probe:
    """One kind of state: how to observe it and what the manifest expects of it."""

    category: str
    observe: Callable[[FreezeManifest], list[dict[str, Any]]]
    observed: str  # Jinja expression giving the observed map from the registered results
    expected: Callable[[FreezeManifest], dict[str, str]]


def _kernel_tasks(_manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [{"name": "observe kernel", "ansible.builtin.command": "uname -r",
             "register": "kernel", **_OBSERVE}]


# dpkg's own view, one "name=version" line per known package ('=' is in neither); the version
# carries the
# status when it is not "ii" (e.g. "1.2-3 [rc]" after a remove that kept the config files).
_DPKG_QUERY = (
    "dpkg-query -W -f '${db:Status-Abbrev}\\t${binary:Package}\\t${Version}\\n'"
    " | awk -F '\\t' '{ s = $1; gsub(/ /, \"\", s); if (s ~ /^u/) next;"
    " print $2 \"=\" $3 (s == \"ii\" ? \"\" : \" [\" s \"]\") }'"
)


def _dpkg_tasks(_manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [{"name": "observe dpkg packages", "ansible.builtin.shell": _DPKG_QUERY,
             "register": "dpkg", **_OBSERVE}]


def _glob_command(patterns: tuple[str, ...]) -> str:
    # Unquoted on purpose: bash expands each pattern (nullglob: no match, no word).
    return (
        "shopt -s nullglob; for p in " + " ".join(patterns) + "; do "
        '[ -d "$p" ] && [ ! -L "$p" ] && continue; printf \'%s\\n\' "$p"; done'
    )


def _file_tasks(manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [
        {
            "name": "observe pinned files",
            "ansible.builtin.stat": {
                "path": "{{ item }}",
                "follow": False,
                "get_checksum": True,
                "checksum_algorithm": "sha256",
                "get_mime": False,
                "get_attributes": False,
            },
            "loop": sorted(manifest.state.files),
            "register": "pinned",
        },
        {
            "name": "observe what the pinned file patterns match now",
            "ansible.builtin.shell": _glob_command(manifest.scope.files),
            "args": {"executable": "/bin/bash"},
            "register": "globbed",
            **_OBSERVE,
        },
    ]


_FILES_OBSERVED = (
    "{%- set out = {} -%}"
    "{%- for path in globbed.stdout_lines -%}"
    "{%- set _ = out.update({path: 'present, not frozen'}) -%}{%- endfor -%}"
    "{%- for r in pinned.results | default([]) -%}{%- set s = r.stat -%}"
    "{%- set _ = out.update({r.item: ('symlink:' ~ s.lnk_target) if s.exists and s.islnk"
    " else ('sha256:' ~ s.checksum) if s.exists and s.isreg"
    " else ('not a regular file' if s.exists else 'absent')}) -%}"
    "{%- endfor -%}{{ out }}"
)


def tree_listing_command(root: str, scope: FreezeScope) -> str:
    """The listing of one tree as coreutils see it (same format as freeze_manifest's)."""
    excluded = " -o ".join(f"-name {shlex.quote(pattern)}" for pattern in scope.tree_excludes)
    prune = f"\\( {excluded} \\) -prune -o " if excluded else ""
    quoted = shlex.quote(root)
    return (
        f"{{ if [ -d {quoted} ] && [ ! -L {quoted} ]; then cd {quoted} && "
        f"{{ find . -xdev {prune}-type f -printf '%P\\0' | xargs -0 -r sha256sum"
        " | sed -E 's/^([0-9a-f]{64})  (.*)$/\\2\\tsha256:\\1/';"
        f" find . -xdev {prune}-type l -printf '%P\\tsymlink:%l\\n'; }}; fi; }} | LC_ALL=C sort"
    )


def _tree_tasks(manifest: FreezeManifest) -> list[dict[str, Any]]:
    commands = {root: tree_listing_command(root, manifest.scope) for root in manifest.scope.trees}
    return [
        {
            "name": "observe tree digests",
            "ansible.builtin.shell": "set -o pipefail; {{ commands[item] }}"
            " | sha256sum | cut -c1-64",
            "args": {"executable": "/bin/bash"},
            "vars": {"commands": commands},
            "loop": list(manifest.scope.trees),
            "register": "trees",
            **_OBSERVE,
        },
        {
            "name": TREE_LISTING_TASK,
            "ansible.builtin.shell": "{{ commands[item.item] }}",
            "args": {"executable": "/bin/bash"},
            "vars": {"commands": commands},
            "loop": "{{ trees.results }}",
            "loop_control": {"label": "{{ item.item }}"},
            "when": "('sha256:' ~ item.stdout) != expected.tree.get(item.item)",
            **_OBSERVE,
        },
    ]


_TREES_OBSERVED = (
    "{%- set out = {} -%}"
    "{%- for r in trees.results -%}{%- set _ = out.update({r.item: 'sha256:' ~ r.stdout}) -%}"
    "{%- endfor -%}{{ out }}"
)


def _venv_tasks(manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [{
        "name": "observe python environments",
        "ansible.builtin.command": "{{ item }}/bin/python -m pip freeze --all "
        "--disable-pip-version-check",
        "loop": sorted(manifest.state.venvs),
        "register": "venvs",
        "failed_when": False,
        **_OBSERVE,
    }]


_VENVS_OBSERVED = (
    "{%- set out = {} -%}"
    "{%- for r in venvs.results | default([]) -%}"
    "{%- for line in r.stdout_lines | reject('match', '#') -%}"
    "{%- set _ = out.update({r.item ~ ':' ~ (line | regex_search('^[^=@ ]+')): line})"
    " -%}{%- endfor -%}{%- endfor -%}{{ out }}"
)


_DIST_NAME = re.compile(r"^[^=@ ]+")


def venv_key(venv: str, line: str) -> str:
    """``<venv>:<distribution>`` (the name is what the audit's regex_replace keeps)."""
    match = _DIST_NAME.match(line)
    return f"{venv}:{match[0] if match else line}"


def _image_tasks(_manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [{
        "name": "observe podman images",
        "ansible.builtin.shell": "if command -v podman >/dev/null; "
        "then podman images --digests --format json; else echo '[]'; fi",
        "register": "podman",
        **_OBSERVE,
    }]


_IMAGES_OBSERVED = (
    "{%- set out = {} -%}"
    "{%- for i in podman.stdout | from_json -%}"
    "{%- set _ = out.update({i.Id: 'digest=' ~ (i.Digest or '') ~ ' names='"
    " ~ ((i.Names or []) | sort | join(','))}) -%}"
    "{%- endfor -%}{{ out }}"
)


def image_value(digest: str, names: tuple[str, ...]) -> str:
    return f"digest={digest} names={','.join(sorted(names))}"


# Listening TCP and UDP ports outside the ephemeral range, as "tcp/22".
_SS_LISTENING = (
    "ss -Hltnu | awk 'NR == FNR { low = $1 + 0; high = $2 + 0; next }"
    " { n = split($5, a, \":\"); p = a[n] + 0; if (p < low || p > high) print $1 \"/\" p }'"
    " /proc/sys/net/ipv4/ip_local_port_range - | LC_ALL=C sort -u"
)


def _socket_tasks(_manifest: FreezeManifest) -> list[dict[str, Any]]:
    return [{"name": "observe listening sockets", "ansible.builtin.shell": _SS_LISTENING,
             "register": "sockets", **_OBSERVE}]


LISTENING = "listening"

PROBES: tuple[Probe, ...] = (
    Probe("kernel", _kernel_tasks, "{{ {'release': kernel.stdout} }}",
          lambda m: {"release": m.state.kernel}),
    Probe("dpkg", _dpkg_tasks, "{{ dict(dpkg.stdout_lines | map('split', '=')) }}",
          lambda m: dict(m.state.packages)),
    Probe("file", _file_tasks, _FILES_OBSERVED, lambda m: dict(m.state.files)),
    Probe("tree", _tree_tasks, _TREES_OBSERVED,
          lambda m: {root: tree.listing_sha256 for root, tree in m.state.trees.items()}),
    Probe("venv", _venv_tasks, _VENVS_OBSERVED,
          lambda m: {venv_key(venv, line): line
                     for venv, lines in m.state.venvs.items()
                     for line in lines if not line.startswith("#")}),
    Probe("podman", _image_tasks, _IMAGES_OBSERVED,
          lambda m: {image.id: image_value(image.digest, image.names)
                     for image in m.state.images}),
    Probe("listen", _socket_tasks, "{{ dict(sockets.stdout_lines | zip_longest([], fillvalue='"
          + LISTENING + "')) }}",
          lambda m: {socket.label: LISTENING for socket in m.state.listening}),
)


def _check_task(probe: Probe) -> dict[str, Any]:
    """One assert per category over every key either map has; its message (on success too)
    is JSON ``{"checked": [keys], "drifts": [{"item", "expected", "found"}]}``. One task rather
    than a loop: a loop item costs ~17 ms of Ansible's time, and dpkg alone has ~400 keys."""
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


def build_playbook(manifest: FreezeManifest) -> list[dict[str, Any]]:
    """One play against the guest: observe everything, gather the maps, assert per item."""
    expected = {probe.category: probe.expected(manifest) for probe in PROBES}
    observe = [task for probe in PROBES for task in probe.observe(manifest)]
    gather = {
        "name": "gather what was observed",
        "ansible.builtin.set_fact": {
            "observed": {probe.category: probe.observed for probe in PROBES},
        },
    }
    return [{
        "name": f"audit the frozen state (manifest {manifest.sha256})",
        "hosts": HOST_GROUP,
        "gather_facts": False,
        "vars": {"expected": expected},
        "tasks": [*observe, gather, *(_check_task(probe) for probe in PROBES)],
    }]
