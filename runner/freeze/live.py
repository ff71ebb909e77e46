"""The guest's live state, what no disk holds: loaded kernel modules, the kernel command line,
effective sysctl values, mounts, the whole nftables ruleset, enabled and active systemd units,
running processes (by executable, with the digest of the image each runs), users and groups,
Podman containers.

Each category is one shell command printing ``key<TAB>value`` lines: the freeze runs it over its
own SSH transport, the audit as an Ansible ``raw`` task, and both turn the lines into the same
map. The commands only read (nothing is written to the guest's disk, which the host audits) and
fork little: under TCG each process start costs milliseconds. What the audit's own SSH session
runs is left out (its cgroup), and so is what the scope names as volatile.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from runner.freeze.manifest import FreezeScope


def glob_ere(globs: tuple[str, ...]) -> str:
    """One POSIX extended regular expression matching a whole string that any glob matches
    (``*`` any run of characters, ``?`` one); ``^$`` (matches nothing real) when none."""
    if not globs:
        return "^$"
    parts = [
        "".join(
            ".*" if c == "*" else "." if c == "?" else re.sub(r"([][.^$+(){}|\\])", r"\\\1", c)
            for c in glob
        )
        for glob in globs
    ]
    return "^(" + "|".join(parts) + ")$"


def _modules(scope: FreezeScope) -> str:
    return "awk '{ print $1 \"\\tloaded\" }' /proc/modules | LC_ALL=C sort"


def _cmdline(scope: FreezeScope) -> str:
    return "printf 'cmdline\\t%s\\n' \"$(tr '\\t' ' ' < /proc/cmdline)\""


def _sysctl(scope: FreezeScope) -> str:
    # Values with tabs (tcp_rmem's three numbers) get spaces: the line's one tab splits it.
    volatile = shlex.quote(glob_ere(scope.sysctl_volatile))
    return (
        "sysctl -a 2>/dev/null | sed -e 's/\\t/ /g' -e 's/ = /\\t/' -e 's/ =$/\\t/'"
        f" | awk -F '\\t' -v skip={volatile} '$1 !~ skip' | LC_ALL=C sort"
    )


def _mounts(scope: FreezeScope) -> str:
    # A mount point mounted over again is told apart by its rank in the mount table.
    skip = shlex.quote(glob_ere(scope.mount_excludes))
    return (
        f"findmnt -rn -o TARGET,FSTYPE,SOURCE,OPTIONS | awk -v skip={skip} '$1 !~ skip {{ k = $1;"
        ' if (k in seen) k = k "#" ++seen[$1]; else seen[k] = 0;'
        ' print k "\\t" $2 " " $3 " " $4 }\''
    )


def _nft(scope: FreezeScope) -> str:
    return "printf 'ruleset\\tsha256:%s\\n' \"$(nft -s list ruleset | sha256sum | cut -c1-64)\""


def _units(scope: FreezeScope) -> str:
    """Active units and their sub-state. (Which units are enabled is on the disk: the symlinks
    under /etc/systemd/system, in the disk inventory.)"""
    skip = shlex.quote(glob_ere(scope.unit_excludes))
    return (
        "systemctl list-units --no-legend --no-pager --plain --state=active"
        " --type=service,socket,timer,path,target"
        f" | awk -v skip={skip} '$1 !~ skip {{ print $1 \"\\tactive \" $4 }}' | LC_ALL=C sort"
    )


def _processes(scope: FreezeScope) -> str:
    """``<executable><TAB>sha256:<digest of the running image>``, one line per executable that
    runs (a replaced binary reads ``<path> (deleted)``; how many of each run is left out: a
    service's workers come and go). One find and two greps read every process.
    Left out: the audit's own session (its session id: the command's pipeline), processes gone
    before they were read, and the scope's excluded executables and cgroups."""
    skip_exe = shlex.quote(glob_ere(scope.process_exe_excludes))
    skip_cgroup = shlex.quote(glob_ere(scope.process_cgroup_excludes))
    return (
        "read -r -a own < /proc/$$/stat; "
        "{ find /proc -mindepth 2 -maxdepth 2 -name exe -printf 'exe\\t%h\\t%l\\n';"
        " grep -H '' /proc/[0-9]*/cgroup"
        " | sed -E 's|^(/proc/[0-9]+)/cgroup:[^:]*:[^:]*:|cg\\t\\1\\t|';"
        " grep -H '' /proc/[0-9]*/stat | sed -E 's|^(/proc/[0-9]+)/stat:.*\\) |st\\t\\1\\t|';"
        " true; } 2>/dev/null"
        f" | awk -F '\\t' -v own=\"${{own[5]}}\" -v skip_exe={skip_exe} -v skip_cg={skip_cgroup}"
        ' \'$1 == "exe" && $3 != "" { exe[$2] = $3 } $1 == "cg" { cg[$2] = $3 }'
        ' $1 == "st" { split($3, f, " "); sid[$2] = f[4] }'
        " END { for (p in exe) { if (!(p in cg) || !(p in sid) || sid[p] == own) continue;"
        " if (exe[p] ~ skip_exe || cg[p] ~ skip_cg) continue;"
        " if (!(exe[p] in at)) at[exe[p]] = p }"
        ' for (e in at) print e "\\t" at[e] }\''
        " | while IFS=$'\\t' read -r exe proc; do"
        " printf '%s\\tsha256:%s\\n' \"$exe\""
        ' "$(sha256sum < "$proc/exe" 2>/dev/null | cut -c1-64)"; done | LC_ALL=C sort'
    )


def _accounts(scope: FreezeScope) -> str:
    return (
        '{ getent passwd | awk -F: \'{ print "user:" $1 "\\t" $3 ":" $4 ":" $6 ":" $7 }\';'
        ' getent group | awk -F: \'{ print "group:" $1 "\\t" $3 ":" $4 }\'; } | LC_ALL=C sort'
    )


def _containers(scope: FreezeScope) -> str:
    return (
        "if command -v podman >/dev/null; then podman ps -a --no-trunc"
        " --format '{{.Names}}\\t{{.ImageID}} {{.State}}' | LC_ALL=C sort; fi"
    )


@dataclass(frozen=True)
class LiveProbe:
    category: str
    command: Callable[[FreezeScope], str]


LIVE_PROBES: tuple[LiveProbe, ...] = (
    LiveProbe("module", _modules),
    LiveProbe("cmdline", _cmdline),
    LiveProbe("sysctl", _sysctl),
    LiveProbe("mount", _mounts),
    LiveProbe("ruleset", _nft),
    LiveProbe("unit", _units),
    LiveProbe("process", _processes),
    LiveProbe("account", _accounts),
    LiveProbe("container", _containers),
)


def parse_lines(stdout: str) -> dict[str, str]:
    """``key<TAB>value`` lines as a map (a line without a tab is a key with an empty value)."""
    pairs = (line.split("\t", 1) for line in stdout.splitlines() if line)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}
