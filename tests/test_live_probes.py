"""The live probes (runner.freeze.live): the scope's globs as EREs, the parsing of their lines,
and each command run with bash on this machine where its tool is here."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from runner.freeze.live import LIVE_PROBES, LiveProbe, glob_ere, parse_lines
from runner.freeze.manifest import FreezeScope, default_scope
from runner.freeze.record import END_LINGERING_EXEC_MONITORS

# What each category needs of this machine (the guest has all of it).
NEEDS: dict[str, tuple[str, ...]] = {
    "module": ("/proc/modules",),
    "cmdline": ("/proc/cmdline",),
    "sysctl": ("sysctl",),
    "mount": ("findmnt",),
    "ruleset": ("nft",),
    "unit": ("systemctl", "/run/systemd/system"),  # systemd as init, not its tool alone
    "process": ("find",),
    "scheduling": ("find",),
    "account": ("getent",),
    "container": (),
    "network": ("ip", "python3"),
    "manager": (),  # without systemd as init: the cgroup tree's limits alone
    "tmpfs": ("findmnt",),
    "sysfs": ("/sys/kernel",),
}
LINE = re.compile(r"^[^\t\n]+\t[^\n]*$")


def run(
    command: str, new_session: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=new_session,
        env=env,
    )


def missing(category: str) -> list[str]:
    return [
        need
        for need in NEEDS[category]
        if not (os.path.exists(need) if need.startswith("/") else shutil.which(need))
    ]


def test_every_probe_has_its_needs_named() -> None:
    assert {probe.category for probe in LIVE_PROBES} == NEEDS.keys()


@pytest.mark.parametrize(
    ("globs", "ere"),
    [
        ((), "^$"),
        (("kernel.random.*",), r"^(kernel\.random\..*)$"),
        (("fs.file-nr", "a?c"), r"^(fs\.file-nr|a.c)$"),
        (("x[1](2){3}+$^|\\",), r"^(x\[1\]\(2\)\{3\}\+\$\^\|\\)$"),
    ],
)
def test_glob_ere(globs: tuple[str, ...], ere: str) -> None:
    assert glob_ere(globs) == ere


@pytest.mark.parametrize(
    ("text", "matches", "misses"),
    [
        ("kernel.random.*", ["kernel.random.uuid", "kernel.random."], ["kernelxrandom.uuid"]),
        ("session-*.scope", ["session-1.scope"], ["session-1xscope", "xsession-1.scope"]),
        ("a?c", ["abc"], ["ac", "abbc"]),
        ("/opt/it's (x)", ["/opt/it's (x)"], ["/opt/it's x"]),
    ],
)
def test_glob_ere_matches_whole_strings_in_awk(text: str, matches: list[str], misses: list[str]):
    """The ERE as the probes pass it: shell-quoted, into an awk -v variable."""
    lines = "\n".join([*matches, *misses]) + "\n"
    skip = shlex.quote(glob_ere((text,)))
    found = run(f"printf %s {shlex.quote(lines)} | awk -v skip={skip} '$0 ~ skip'")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == matches


def test_parse_lines() -> None:
    text = "b\t2\na\t1\tmore\n\nflag\nb\t3\n"
    # The first tab splits; an empty line is nothing; no tab: an empty value; the last wins.
    assert parse_lines(text) == {"b": "3", "a": "1\tmore", "flag": ""}
    assert parse_lines("") == {}


@pytest.mark.parametrize("probe", LIVE_PROBES, ids=lambda probe: probe.category)
def test_each_probe_runs_here_and_prints_key_tab_value_lines(probe: LiveProbe) -> None:
    if absent := missing(probe.category):
        pytest.skip(f"this machine has no {', '.join(absent)}")
    result = run(probe.command(default_scope()))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    bad = [line for line in lines if not LINE.match(line)]
    assert not bad, bad[:5]
    if probe.category not in ("container", "ruleset", "module", "manager"):
        assert lines, f"{probe.category} printed nothing"
    keys = [line.partition("\t")[0] for line in lines]
    if probe.category != "sysctl":  # a multi-line sysctl value repeats its key
        assert len(set(keys)) == len(keys), "every key once"


def test_the_sysctl_probe_leaves_the_volatile_keys_out() -> None:
    if missing("sysctl"):
        pytest.skip("this machine has no sysctl")
    [probe] = [p for p in LIVE_PROBES if p.category == "sysctl"]
    every = parse_lines(run(probe.command(FreezeScope(disk_excludes=()))).stdout)
    kept = parse_lines(run(probe.command(default_scope())).stdout)
    assert any(key.startswith("kernel.random.") for key in every)
    assert not any(key.startswith("kernel.random.") for key in kept)
    assert kept.keys() < every.keys()


def test_the_mount_probe_leaves_the_excluded_mount_points_out() -> None:
    if missing("mount"):
        pytest.skip(f"this machine has no {', '.join(missing('mount'))}")
    [probe] = [p for p in LIVE_PROBES if p.category == "mount"]
    every = parse_lines(run(probe.command(FreezeScope(disk_excludes=()))).stdout)
    kept = parse_lines(
        run(probe.command(FreezeScope(disk_excludes=(), mount_excludes=("/proc*",)))).stdout
    )
    assert "/proc" in every and "/" in every
    assert "/" in kept and not any(key.startswith("/proc") for key in kept)


def test_the_cmdline_probe_prints_the_kernels_command_line() -> None:
    [probe] = [p for p in LIVE_PROBES if p.category == "cmdline"]
    cmdline = Path("/proc/cmdline").read_text().strip().replace("\t", " ")
    assert parse_lines(run(probe.command(default_scope())).stdout) == {"cmdline": cmdline}


def test_the_process_probe_names_each_executable_with_its_image_digest(
    tmp_path: Path,
) -> None:
    sleep = Path(os.path.realpath(shutil.which("sleep") or "/usr/bin/sleep"))
    digest = hashlib.sha256(sleep.read_bytes()).hexdigest()
    copy = tmp_path / "my tools" / "sleep"  # a name with a space, run by this test alone
    excluded = tmp_path / "excluded-sleep"
    copy.parent.mkdir()
    # The probe's own pipeline from copies, so that only this probe runs them.
    tools = tmp_path / "pipeline"
    tools.mkdir()
    pipeline = ("find", "grep", "sed", "awk", "sort", "cut", "sha256sum")
    for tool in pipeline:
        shutil.copy2(os.path.realpath(shutil.which(tool) or tool), tools / tool)
    for target in (copy, excluded):
        shutil.copy2(sleep, target)
    [probe] = [p for p in LIVE_PROBES if p.category == "process"]
    scope = FreezeScope(disk_excludes=(), process_exe_excludes=(str(tmp_path / "excluded*"),))
    environment = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}

    def observe() -> subprocess.CompletedProcess[str]:
        # In its own session: the probe leaves out its own session only.
        return run(probe.command(scope), new_session=True, env=environment)

    children = [
        subprocess.Popen([str(path), "300"], start_new_session=True)
        for path in (sleep, copy, copy, excluded)
    ]
    try:
        result = observe()
        copy.unlink()  # the image of a running process gone: "<path> (deleted)"
        after = parse_lines(observe().stdout)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert result.returncode == 0, result.stderr
    seen = parse_lines(result.stdout)
    assert seen[str(sleep)] == f"sha256:{digest}"
    assert seen[str(copy)] == f"sha256:{digest}"  # two of it run: one line, no count
    assert str(excluded) not in seen  # the scope's excluded executable
    ours = {str(tools / tool) for tool in pipeline}
    assert not ours & seen.keys(), "the probe's own pipeline is not state of the guest"
    assert after[f"{copy} (deleted)"] == f"sha256:{digest}"
    assert str(copy) not in after


def test_the_freezes_end_of_lingering_exec_monitors_does_not_wait_on_itself() -> None:
    """Run as the guest transport runs it (bash -c): with no monitor left it returns at once;
    a pattern that matched its own command line waited 100 turns (a freeze timed out on it)."""
    if not shutil.which("pgrep"):
        pytest.skip("this machine has no pgrep")
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", END_LINGERING_EXEC_MONITORS], timeout=60, check=False)
    assert done.returncode == 0
    assert time.monotonic() - started < 5
