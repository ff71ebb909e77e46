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
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

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


def _sessions(scope: FreezeScope) -> str:
    """Sets bash's ``sessions`` to the identified login sessions' logind ids, space-separated:
    the collector's own (``/proc/self/sessionid``) and each session whose leader is an SSH
    connection's server (the scope's ``ssh_session_executable``, child of its listener). Any
    other session is state like any other unit."""
    sshd = shlex.quote(scope.ssh_session_executable or "-")
    listener = shlex.quote(scope.ssh_listener_executable or "-")
    return (
        "own_session=; read -r own_session < /proc/self/sessionid 2>/dev/null;"
        ' sessions=" $own_session "; id=; leader=;'
        " if command -v loginctl >/dev/null; then"
        " while IFS='=' read -r k v; do case $k in Id) id=$v ;; Leader) leader=$v ;; esac;"
        ' if [ -n "$id" ] && [ -n "$leader" ]; then st=();'
        ' read -r -a st < "/proc/$leader/stat" 2>/dev/null;'
        f' if [ "$(readlink "/proc/$leader/exe")" = {sshd} ]'
        f' && [ "$(readlink "/proc/${{st[3]:-0}}/exe")" = {listener} ];'
        ' then sessions+="$id "; fi; id=; leader=; fi;'
        " done < <(ids=$(loginctl list-sessions --no-legend 2>/dev/null | awk '{ print $1 }');"
        ' [ -z "$ids" ] || loginctl show-session $ids -p Id -p Leader 2>/dev/null); fi; '
    )


def _podman_mounts(scope: FreezeScope) -> str:
    """Sets bash's ``podman_mounts`` to the mount points Podman's storage says it made, one a
    line: its driver's home (bound on itself), and each container's root (its layer's merged
    directory) and shm, by the ids in the storage's container list."""
    if not scope.podman_graph_root:
        return "podman_mounts=; "
    root = shlex.quote(scope.podman_graph_root)
    return (
        f"podman_mounts={root}/overlay$'\\n'; while IFS=: read -r k v; do case $k in"
        f" id) podman_mounts+={root}/overlay-containers/$v/userdata/shm$'\\n' ;;"
        f" layer) podman_mounts+={root}/overlay/$v/merged$'\\n' ;; esac;"
        f' done < <(grep -oE \'"(id|layer)": *"[0-9a-f]{{64}}"\''
        f" {root}/overlay-containers/containers.json 2>/dev/null | tr -d '\" '); "
    )


def _mounts(scope: FreezeScope) -> str:
    """Every mount: ``<target>[#rank]<TAB><fstype> <source> <options>`` (a mount point mounted
    over again is told apart by its rank in the mount table). Left out only what Podman's
    storage names (see _podman_mounts: exactly those targets; its driver's home only as a bind
    of itself); a freeze before #23 also left out its scope's mount globs."""
    skip = shlex.quote(glob_ere(scope.mount_excludes))
    return (
        _podman_mounts(scope)
        + "findmnt -rn -o TARGET,FSTYPE,SOURCE,OPTIONS | awk -v skip="
        + skip
        + ' -v podman="$podman_mounts" -v home='
        + shlex.quote(f"{scope.podman_graph_root}/overlay" if scope.podman_graph_root else "-")
        + ' \'BEGIN { n = split(podman, m, "\\n"); for (i = 1; i <= n; i++) if (m[i] != "")'
        " ours[m[i]] = 1 }"
        " $1 ~ skip { next }"
        ' ($1 in ours) && ($1 != home || $3 ~ ("\\\\[" home "\\\\]$")) { next }'
        " { k = $1;"
        ' if (k in seen) k = k "#" ++seen[$1]; else seen[k] = 0;'
        ' print k "\\t" $2 " " $3 " " $4 }\''
    )


def _nft(scope: FreezeScope) -> str:
    return "printf 'ruleset\\tsha256:%s\\n' \"$(nft -s list ruleset | sha256sum | cut -c1-64)\""


# awk's BEGIN of a probe that leaves out the identified sessions (_sessions): ``session[<unit>]``.
_SESSION_UNITS = (
    'BEGIN { n = split(sessions, s, " ");'
    ' for (i = 1; i <= n; i++) session["session-" s[i] ".scope"] = 1 }'
)


def _units(scope: FreezeScope) -> str:
    """Active units and their sub-state. (Which units are enabled is on the disk: the symlinks
    under /etc/systemd/system, in the disk inventory.) Left out: the scope units of the
    identified login sessions (_sessions); a freeze before #23 also left out unit globs."""
    skip = shlex.quote(glob_ere(scope.unit_excludes))
    return (
        _sessions(scope) + "systemctl list-units --no-legend --no-pager --plain --state=active"
        " --type=service,socket,timer,path,target,slice,scope"
        f' | awk -v skip={skip} -v sessions="$sessions"'
        f" '{_SESSION_UNITS}"
        ' $1 !~ skip && !($1 in session) { print $1 "\\tactive " $4 }\' | LC_ALL=C sort'
    )


def _selected_processes(scope: FreezeScope, reads: str, emit: str) -> str:
    """Reads every process (``/proc/<pid>``: its executable, its stat line, and what ``reads``
    prints as ``<kind><TAB>/proc/<pid><TAB><value>`` lines, kept in awk's ``got[<kind>, p]``,
    the values of one kind and process joined by commas in the order read)
    and runs the awk statements ``emit`` for each process that is state (``p``, its
    executable ``exe[p]``, its stat fields after the name ``st[p]``).

    Left out by identity, from the process tree (no name or cgroup a process could take): the
    collector itself and what it starts (its descendants), its ancestry up to its connection's
    SSH server (the chain of parents through the scope's ``ssh_session_executable`` up to the
    one whose parent is the listener; without SSH, up to its session leader), and each other
    connection's own SSH server processes (that executable, child of the listener or of such a
    process), not what they run. Processes gone before they were read are left out too, and
    kernel threads (no executable). A freeze before #23 also left out its scope's executable
    and cgroup globs."""
    skip_exe = shlex.quote(glob_ere(scope.process_exe_excludes))
    skip_cgroup = shlex.quote(glob_ere(scope.process_cgroup_excludes))
    cgroups = (
        " grep -H '' /proc/[0-9]*/cgroup"
        " | sed -E 's|^(/proc/[0-9]+)/cgroup:[^:]*:[^:]*:|cg\\t\\1\\t|';"
        if scope.process_cgroup_excludes
        else ""
    )
    return (
        "{ find /proc -mindepth 2 -maxdepth 2 -name exe -printf 'exe\\t%h\\t%l\\n';"
        f"{cgroups}{reads}"
        " grep -H '' /proc/[0-9]*/stat | sed -E 's|^(/proc/[0-9]+)/stat:.*\\) |st\\t\\1\\t|';"
        " true; } 2>/dev/null"
        f" | awk -F '\\t' -v me=\"/proc/$$\" -v skip_exe={skip_exe} -v skip_cg={skip_cgroup}"
        f" -v sshd={shlex.quote(scope.ssh_session_executable or '-')}"
        f" -v listener={shlex.quote(scope.ssh_listener_executable or '-')}"
        ' \'$1 == "exe" && $3 != "" { exe[$2] = $3; next } $1 == "cg" { cg[$2] = $3; next }'
        ' $1 == "st" { st[$2] = $3; split($3, f, " "); ppid[$2] = "/proc/" f[2]; sid[$2] = f[4];'
        ' next } { k = $1 SUBSEP $2; if (k in got) got[k] = got[k] "," $3; else got[k] = $3 }'
        ' END { p = me; while ((p in ppid) && p != "/proc/1") { mine[p] = 1; q = ppid[p];'
        " if (exe[q] != sshd && (exe[p] == sshd || sid[p] == substr(p, 7))) break; p = q }"
        " for (p in exe) { q = p; for (i = 0; i < 64 && (q in ppid); i++) {"
        " if (q == me) { mine[p] = 1; break } q = ppid[q] } }"
        " for (p in exe) { if (!(p in ppid) || (p in mine)) continue;"
        " if (exe[p] == sshd && (exe[ppid[p]] == listener || exe[ppid[p]] == sshd)) continue;"
        " if (exe[p] ~ skip_exe || ((p in cg) && cg[p] ~ skip_cg)) continue;"
        f" {emit} }} }}'"
    )


def _processes(scope: FreezeScope) -> str:
    """``<executable><TAB>sha256:<digest of the running image>``, one line per executable that
    runs (a replaced binary reads ``<path> (deleted)``; how many of each run is left out: a
    service's workers come and go); which processes are state: _selected_processes."""
    return (
        _selected_processes(
            scope, "", 'if (!(exe[p] in at)) at[exe[p]] = p } for (e in at) { print e "\\t" at[e]'
        )
        + " | while IFS=$'\\t' read -r exe proc; do"
        " printf '%s\\tsha256:%s\\n' \"$exe\""
        ' "$(sha256sum < "$proc/exe" 2>/dev/null | cut -c1-64)"; done | LC_ALL=C sort'
    )


def _scheduling(scope: FreezeScope) -> str:
    """``<executable><TAB><settings>[; <settings>...]``: how the processes of each executable
    are scheduled and bounded, what every process they start inherits (a renice, a CPU pin, a
    lowered resource limit or a move into a throttled cgroup of sshd or of the warm Harbor
    process is felt by every cell): ``nice <n> policy <n> rt <n> cpus <list> oom <adj> cgroup
    <path> limits <name>=<soft>/<hard>,...``, each distinct setting once, sorted. The same
    processes as _processes."""
    reads = (
        " grep -H '' /proc/[0-9]*/oom_score_adj"
        " | sed -E 's|^(/proc/[0-9]+)/oom_score_adj:|oom\\t\\1\\t|';"
        " grep -H '^Cpus_allowed_list:' /proc/[0-9]*/status"
        " | sed -E 's|^(/proc/[0-9]+)/status:Cpus_allowed_list:[[:space:]]*|cpus\\t\\1\\t|';"
        " grep -H '^0::' /proc/[0-9]*/cgroup | sed -E 's|^(/proc/[0-9]+)/cgroup:0::|cgp\\t\\1\\t|';"
        " grep -H '^Max ' /proc/[0-9]*/limits | sed -E 's|^(/proc/[0-9]+)/limits:Max"
        " ([a-z]+( [a-z]+)*) {2,}([^ ]+) +([^ ]+).*|lim\\t\\1\\t\\2=\\4/\\5|';"
    )
    # After the name, stat's 17th field is the nice value, its 38th the real-time priority and
    # its 39th the policy (proc(5) counts them from the pid: 19, 40, 41).
    emit = (
        'split(st[p], f, " "); print exe[p] "\\tnice " f[17] " policy " f[39] " rt " f[38]'
        ' " cpus " got["cpus", p] " oom " got["oom", p] " cgroup " got["cgp", p]'
        ' " limits " got["lim", p]'
    )
    return (
        _selected_processes(scope, reads, emit)
        + " | LC_ALL=C sort -u | awk -F '\\t' '$1 == e { v = v \"; \" $2; next }"
        ' { if (e != "") print e "\\t" v; e = $1; v = $2 }'
        ' END { if (e != "") print e "\\t" v }\''
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


NETWORK_SCRIPT = "guest/live_network.py"


def _network(scope: FreezeScope) -> str:
    """Links (kind, state), addresses, routes of every table, policy rules, the neighbours in
    the scope's ``neighbour_states``, the resolver's servers: runner/guest/live_network.py,
    given to the guest's python3 on its command line (one process; ``ip -j`` beneath it)."""
    script = resources.files("runner").joinpath(NETWORK_SCRIPT).read_text()
    states = shlex.quote(",".join(scope.neighbour_states) or "-")
    return f"python3 -I -c {shlex.quote(script)} {states}"


# The resource properties of a unit that change what its processes get.
UNIT_RESOURCES = (
    "CPUQuotaPerSecUSec,CPUQuotaPeriodUSec,CPUWeight,StartupCPUWeight,IOWeight,StartupIOWeight,"
    "MemoryMin,MemoryLow,MemoryHigh,MemoryMax,MemorySwapMax,TasksMax,AllowedCPUs,"
    "AllowedMemoryNodes,CPUAffinity,Nice,CPUSchedulingPolicy,IOSchedulingClass,OOMScoreAdjust,"
    "LimitNOFILE,LimitNPROC,LimitCPU,LimitAS,IOReadBandwidthMax,IOWriteBandwidthMax,"
    "IOReadIOPSMax,IOWriteIOPSMax,DropInPaths"
)
CGROUP_ROOT = "/sys/fs/cgroup"
# The cgroup tree's limit files (grep --include globs of a file's name): what a cgroup's
# processes may use, how they are clamped, partitioned, frozen or killed together.
CGROUP_LIMITS = (
    "cpu.max",
    "cpu.max.burst",
    "cpu.weight",
    "cpu.idle",
    "cpu.uclamp.min",
    "cpu.uclamp.max",
    "cpuset.cpus",
    "cpuset.mems",
    "cpuset.cpus.partition",
    "memory.max",
    "memory.high",
    "memory.low",
    "memory.min",
    "memory.swap.max",
    "memory.zswap.max",
    "memory.oom.group",
    "io.max",
    "io.weight",
    "io.latency",
    "pids.max",
    "hugetlb.*.max",
    "cgroup.freeze",
    "cgroup.max.depth",
    "cgroup.max.descendants",
)


def _manager(scope: FreezeScope) -> str:
    """The service manager: its environment (``env:<name>``, what every unit started after
    inherits), its own properties but the scope's ``manager_volatile`` (``manager:<name>``),
    the resource properties and drop-ins of every active slice and scope, runtime ones included
    (``unit:<unit>``: where a runtime limit on a group of units goes), and the cgroup tree's
    limit files (``cgroup:<path>``: every running unit's effective CPU, memory, IO and pids
    limits). A service's own properties are not asked of systemd (``systemctl show`` reads
    every property of each unit: 26 s for 73 units under TCG); its limits are its cgroup's
    files, its drop-ins files on the disk or on /run (the tmpfs category). Left out: the
    identified login sessions' scopes and cgroups (_sessions)."""
    volatile = shlex.quote(glob_ere(scope.manager_volatile))
    includes = " ".join(f"--include={name}" for name in CGROUP_LIMITS)
    root = shlex.quote(CGROUP_ROOT)
    return (
        _sessions(scope)
        + "{ systemctl show-environment | sed -e 's/\\t/ /g' -e 's/^/env:/' -e 's/=/\\t/';"
        f" systemctl show | awk -v skip={volatile}"
        ' \'{ k = $0; sub(/=.*/, "", k); v = substr($0, length(k) + 2); gsub(/\\t/, " ", v);'
        ' if (k !~ skip) print "manager:" k "\\t" v }\';'
        " systemctl list-units --no-legend --no-pager --plain --full --state=active"
        " --type=slice,scope"
        f" | awk -v sessions=\"$sessions\" '{_SESSION_UNITS} !($1 in session) {{ print $1 }}'"
        f" | xargs -r systemctl show -p Id,{UNIT_RESOURCES} --"
        ' | awk \'BEGIN { RS = ""; FS = "\\n" } { id = ""; v = "";'
        " for (i = 1; i <= NF; i++) if ($i ~ /^Id=/) id = substr($i, 4);"
        ' else v = v (v == "" ? "" : " ") $i; gsub(/\\t/, " ", v);'
        ' if (id != "") print "unit:" id "\\t" v }\';'
        f" grep -r -H '' {includes} {root} 2>/dev/null"
        f' | awk -v sessions="$sessions" -v root={root}'
        ' \'BEGIN { n = split(sessions, s, " ");'
        ' for (i = 1; i <= n; i++) own["/session-" s[i] ".scope/"] = 1 }'
        ' { for (o in own) if (index($0, o)) next; p = $0; sub(/:.*/, "", p);'
        ' v = substr($0, length(p) + 2); gsub(/\\t/, " ", v); p = substr(p, length(root) + 1);'
        ' print "cgroup:" p "\\t" v }\';'
        " true; } | LC_ALL=C sort"
    )


def _tmpfs(scope: FreezeScope) -> str:
    """Every file of every tmpfs and devtmpfs mount, what no disk holds (/run, /dev/shm, /tmp
    when it is one, /run/user/<uid>, /dev): ``<path><TAB><type> <mode> <uid>:<gid>``, then
    ``sha256:<hex>`` of a file's contents or ``-> <target>`` of a symlink. Left out: the
    files of the identified login sessions (the scope's ``session_runtime_files``, each with
    what is below it); the contents (not the entry) of ``tmpfs_content_volatile``."""
    templates = " ".join(shlex.quote(t) for t in scope.session_runtime_files)
    volatile = shlex.quote("\n".join(scope.tmpfs_content_volatile))
    return (
        _sessions(scope)
        + "skip=; for s in $sessions; do for t in "
        + (templates or "''")
        + '; do [ -n "$t" ] && skip+="${t//\\{session\\}/$s}"$\'\\n\'; done; done;'
        " mapfile -t roots < <(findmnt -rn -t tmpfs,devtmpfs -o TARGET);"
        " { find \"${roots[@]}\" -xdev -printf 'e\\t%p\\t%y %m %U:%G\\t%l\\n';"
        " find \"${roots[@]}\" -xdev -type f -print0 | xargs -0 -r sha256sum | sed 's/^/h\\t/';"
        " true; } 2>/dev/null"
        f" | awk -F '\\t' -v skip=\"$skip\" -v volatile={volatile}"
        ' \'BEGIN { n = split(skip, a, "\\n");'
        ' for (i = 1; i <= n; i++) if (a[i] != "") gone[a[i]] = 1;'
        ' n = split(volatile, a, "\\n"); for (i = 1; i <= n; i++) moves[a[i]] = 1 }'
        ' $1 == "h" { sha[substr($2, 67)] = substr($2, 1, 64); next }'
        ' $1 == "e" { e[$2] = $3; l[$2] = $4 }'
        " END { for (p in e) { q = p; left = 0;"
        ' while (q != "") { if (q in gone) { left = 1; break }'
        ' sub(/\\/[^\\/]*$/, "", q) } if (left) continue; v = e[p];'
        ' if (substr(v, 1, 1) == "l") v = v " -> " l[p];'
        ' else if ((p in sha) && !(p in moves)) v = v " sha256:" sha[p];'
        ' print p "\\t" v } }\' | LC_ALL=C sort'
    )


# The /sys knobs that change how the guest runs: transparent hugepages and khugepaged, KSM,
# multi-gen LRU, SMT and which CPUs are online, CPU frequency and idle governors, each block
# device's queue, and the parameters of every module (built in or loaded) that can be read.
SYS_KNOBS = (
    "/sys/kernel/mm/transparent_hugepage/{enabled,defrag,shmem_enabled,use_zero_page}",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/{defrag,pages_to_scan,scan_sleep_millisecs,"
    "alloc_sleep_millisecs,max_ptes_none,max_ptes_swap,max_ptes_shared}",
    "/sys/kernel/mm/ksm/run",
    "/sys/kernel/mm/lru_gen/enabled",
    "/sys/devices/system/cpu/smt/control",
    "/sys/devices/system/cpu/cpu[0-9]*/online",
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_{governor,min_freq,max_freq}",
    "/sys/devices/system/cpu/cpufreq/boost",
    "/sys/devices/system/cpu/cpuidle/current_governor",
    "/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*/disable",
    "/sys/block/*/queue/{scheduler,read_ahead_kb,nr_requests,wbt_lat_usec,max_sectors_kb}",
    "/sys/module/*/parameters/*",
)


SWAPS = "/proc/swaps"


def _sysfs(scope: FreezeScope) -> str:
    """``<path><TAB><value>`` of each knob of SYS_KNOBS that exists and can be read, and
    ``swap:<file or device><TAB><type> priority <n>`` of each swap area in use (how full it is
    moves by itself; that it is there changes how memory runs out)."""
    return (
        "shopt -s nullglob; knobs=(" + " ".join(SYS_KNOBS) + ");"
        " { grep -H '' \"${knobs[@]}\" 2>/dev/null | sed -e 's/\\t/ /g' -e 's/:/\\t/';"
        ' awk \'NR > 1 { print "swap:" $1 "\\t" $2 " priority " $5 }\' '
        + shlex.quote(SWAPS)
        + " 2>/dev/null;"
        " true; } | LC_ALL=C sort -t \"$(printf '\\t')\" -k1,1 -u"
    )


# A short fixed probe of the guest's speed, seconds each: the CPU hashing 16 MiB of zeros, the
# disk read 128 MiB from the root device's start, past the page cache. Nothing is written.
SPEED_COMMAND = (
    "s0=$EPOCHREALTIME; head -c 16M /dev/zero | sha256sum >/dev/null; s1=$EPOCHREALTIME;"
    ' dd if="$(findmnt -nvo SOURCE /)" of=/dev/null bs=1M count=128 iflag=direct status=none;'
    ' s2=$EPOCHREALTIME; awk -v a="$s0" -v b="$s1" -v c="$s2"'
    " 'BEGIN { printf \"cpu\\t%.3f\\ndisk\\t%.3f\\n\", b - a, c - b }'"
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
    LiveProbe("scheduling", _scheduling),
    LiveProbe("account", _accounts),
    LiveProbe("container", _containers),
    LiveProbe("network", _network),
    LiveProbe("manager", _manager),
    LiveProbe("tmpfs", _tmpfs),
    LiveProbe("sysfs", _sysfs),
)


# Categories added after freezes were made (#23; scheduling after its first plants): a freeze
# without one is named by the audit (freeze again), never compared as if the guest had none.
LATE_CATEGORIES = frozenset({"network", "manager", "tmpfs", "sysfs", "scheduling"})


def parse_speed(stdout: str) -> tuple[float, float]:
    """The speed probe's ``cpu`` and ``disk`` seconds; a line missing or not a number raises
    ValueError."""
    seen = parse_lines(stdout)
    return float(seen["cpu"]), float(seen["disk"])


def parse_lines(stdout: str) -> dict[str, str]:
    """``key<TAB>value`` lines as a map (a line without a tab is a key with an empty value)."""
    pairs = (line.split("\t", 1) for line in stdout.splitlines() if line)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def concurrent_command(commands: dict[str, str], nonce: str) -> str:
    """Every command at once, each writing into a pipe of its own (bash's process substitution:
    no file is made in the guest, so the audit does not move the tmpfs it audits), then their
    outputs in turn, each framed by ``nonce`` lines: ``<nonce> begin <name>``, the command's
    lines, ``<nonce> exit <status> <name>``. Exits 1 when any command failed, naming each on
    stderr. The nonce is the caller's secret of the moment: nothing the guest prints can forge
    a frame."""
    starts = "".join(
        # A newline ends the command (some end in "; " already); its own subshell, so that even
        # an `exit` in it leaves the frame's end to be printed.
        f"exec {{fd_{i}}}< <( (set -o pipefail; {command}\n);"
        f" printf '\\n{nonce} exit %s %s\\n' \"$?\" {shlex.quote(name)}); "
        for i, (name, command) in enumerate(commands.items())
    )
    reads = "".join(
        f"printf '{nonce} begin %s\\n' {shlex.quote(name)}; cat <&$fd_{i}; "
        for i, name in enumerate(commands)
    )
    failed = (
        f'$1 == "{nonce}" && $2 == "exit" && $3 != 0'
        ' { bad = 1; print $4 " failed (exit " $3 ")" > "/dev/stderr" }'
    )
    return f"{starts}{{ {reads}}} | awk '{failed} {{ print }} END {{ exit bad }}'"


def frame_nonce() -> str:
    """A fresh nonce for one ``concurrent_command``."""
    return "@@" + secrets.token_hex(8)


def frame_begin(nonce: str, name: str) -> str:
    """The line before a command's output (``concurrent_command`` prints it)."""
    return f"{nonce} begin {name}\n"


def frame_end(nonce: str) -> str:
    """What follows a command's output (``concurrent_command`` prints it)."""
    return f"\n{nonce} exit "


def framed_sections(output: str, names: tuple[str, ...], nonce: str) -> dict[str, str]:
    """What each command of ``concurrent_command`` printed, without its frame."""
    return {
        name: output.split(frame_begin(nonce, name), 1)[1].split(frame_end(nonce), 1)[0]
        for name in names
    }
