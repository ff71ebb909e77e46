# ruff: noqa: E501 (the logs are Podman's and the tools' own lines, as long as they are)
"""Every task image's build tried, and each failure's own line (runner.guest.build_report): the
lines are Podman's, apt's, pip's and gcc's own words, as a failed ``podman build`` logs them."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from deploy.guest import operations as guest_ops
from runner.guest import build_report
from runner.guest.build_report import (
    TIMED_OUT,
    BuildFailure,
    _failure,
    failure_line,
    failure_table,
    missing_packages,
    read_builds,
)
from runner.guest.task_images import TaskImageBuild
from tests.support.deploy_harness import local_host, yielded

APT_MISS = """STEP 1/3: FROM localhost/base:1
STEP 2/3: RUN apt-get update && apt-get install -y sqlite3 xxd python3-pip
Get:1 http://10.0.2.101/debian ./ Release [1189 B]
Reading package lists...
Building dependency tree...
Package python3-pip is not available, but is referred to by another package.
E: Unable to locate package sqlite3
E: Unable to locate package xxd
E: Package 'python3-pip' has no installation candidate
Error: building at STEP "RUN apt-get update && apt-get install -y sqlite3": while running runtime: exit status 100
"""
PIP_MISS = """STEP 3/4: RUN pip install pyarrow==17.0.0
Looking in indexes: http://10.0.2.101/simple/
ERROR: Could not find a version that satisfies the requirement pyarrow==17.0.0 (from versions: none)
ERROR: No matching distribution found for pyarrow==17.0.0
Error: building at STEP "RUN pip install pyarrow==17.0.0": while running runtime: exit status 1
"""
GCC = """STEP 4/5: RUN gcc -o /app/x /app/x.c
\x1b[01m\x1b[Kgcc:\x1b[m\x1b[K \x1b[01;31m\x1b[Kfatal error: \x1b[m\x1b[Kcannot execute 'cc1': No such file
compilation terminated.
Error: building at STEP "RUN gcc -o /app/x /app/x.c": while running runtime: exit status 1
"""


def test_apt_names_every_package_the_frozen_set_lacks() -> None:
    assert failure_line(APT_MISS, 1) == "E: Unable to locate package sqlite3"
    assert missing_packages(APT_MISS) == ("sqlite3", "xxd", "python3-pip")


def test_pip_names_the_requirement_it_found_no_wheel_for() -> None:
    assert failure_line(PIP_MISS, 1).startswith("ERROR: Could not find a version")
    assert missing_packages(PIP_MISS) == ("pyarrow==17.0.0",)


def test_a_compiler_error_is_its_own_line_without_colour_codes() -> None:
    line = failure_line(GCC, 1)
    assert line == "gcc: fatal error: cannot execute 'cc1': No such file"
    assert missing_packages(GCC) == ()


def test_without_a_known_cause_the_failed_steps_last_line_then_podmans() -> None:
    ls = (
        "STEP 2/2: RUN echo building && ls /no/such/dir\nbuilding\n"
        "ls: cannot access '/no/such/dir': No such file or directory\n"
        'Error: building at STEP "RUN echo building && ls /no/such/dir": while running runtime\n'
    )
    assert failure_line(ls, 1) == "ls: cannot access '/no/such/dir': No such file or directory"
    podman = 'STEP 2/2: RUN ./configure\nError: building at STEP "RUN ./configure"\n'
    assert failure_line(podman, 1) == 'Error: building at STEP "RUN ./configure"'
    assert failure_line("one\nsomething odd happened\n\n", 2) == "something odd happened"
    assert failure_line("", 3) == "no output (exit status 3)"


DPKG_SCRIPT = """Setting up screen (4.9.1-3) ...
/var/lib/dpkg/info/screen.postinst: 4: .: cannot open /usr/share/debconf/confmodule: No such file
dpkg: error processing package screen (--configure):
 installed screen package post-installation script subprocess returned error exit status 2
Errors were encountered while processing:
 screen
E: Sub-process /usr/bin/dpkg returned an error code (1)
Error: building at STEP "RUN apt-get install -y screen": while running runtime: exit status 100
"""


def test_a_failed_maintainer_script_is_named_by_its_own_words_not_apts() -> None:
    """As the lab's local substitute made screen's postinst fail (seen in the vmtest guest)."""
    assert failure_line(DPKG_SCRIPT, 100) == (
        "/var/lib/dpkg/info/screen.postinst: 4: .: cannot open /usr/share/debconf/confmodule: "
        "No such file"
    )


def test_a_build_past_its_timeout_says_so_with_the_tasks_limit() -> None:
    line = failure_line(APT_MISS, TIMED_OUT, 600.0)
    assert line == (
        "stopped: ran past its build timeout (600 s) (task.toml's build_timeout_sec, times the "
        "lock's tasks.environment_build_timeout_multiplier)"
    )


def test_the_table_has_a_row_per_failed_task_and_how_to_add_what_is_missing() -> None:
    failures = [
        BuildFailure("sqlite-db-truncate", "E: Unable to locate package sqlite3", ("sqlite3",)),
        BuildFailure("polyglot-c-py", "gcc: fatal error: cannot execute 'cc1'", ()),
    ]
    table = failure_table(failures, 5).splitlines()
    assert table[0] == "2 of 5 task images did not build:"
    assert table[1].split() == ["task", "step", "error"]
    assert table[2].split()[:3] == ["sqlite-db-truncate", "build", "E:"]
    assert table[3].split()[:2] == ["polyglot-c-py", "build"]
    assert table[4] == (
        "  task sqlite-db-truncate: the lab's frozen package set has no sqlite3: record what "
        "its build takes with 'runner resolve LOCK --lab LAB', then deploy again"
    )
    assert len(table) == 5


def test_each_task_is_read_from_its_own_log_and_status(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(APT_MISS)
    (tmp_path / "a.failed").write_text("100\n")
    (tmp_path / "b.log").write_text("STEP 1/1: FROM x\n")
    (tmp_path / "b.failed").write_text(f"{TIMED_OUT}\n")

    def build(task: str, timeout: float) -> TaskImageBuild:
        return TaskImageBuild(
            task=task, image="x", inputs_digest="sha256:x", build_timeout_sec=timeout
        )

    assert _failure(tmp_path, build("a", 600)) == BuildFailure(
        "a", "E: Unable to locate package sqlite3", ("sqlite3", "xxd", "python3-pip")
    )
    assert "timeout (900 s)" in _failure(tmp_path, build("b", 900)).line
    assert _failure(tmp_path, build("never", 600)).line == (
        "no image and no build log: the build did not run"
    )


# A name with what a shell or a split on '=' would take apart: the JSON and its quoting keep it.
BUILDS = (
    TaskImageBuild(
        task="git-leak-recovery", image="localhost/bench-task-git-leak-recovery:frozen",
        inputs_digest="sha256:in", build_timeout_sec=600.0,
    ),
    TaskImageBuild(
        task="it's=odd $HOME", image="localhost/x:frozen", inputs_digest="sha256:b=c",
        build_timeout_sec=1.5,
    ),
)  # fmt: skip


def _report_argv(builds: tuple[TaskImageBuild, ...]) -> list[str]:
    """The argv the guest's build report gets from the deploy's command (a shell splits it)."""
    host = local_host({})
    host.get_fact = lambda fact, **_kwargs: ""  # type: ignore[method-assign]  # no image labelled
    (command,) = yielded(host, guest_ops.task_images_built, images=builds)
    argv = shlex.split(str(command))
    assert argv[:3] == ["/opt/bench/harbor/bin/python", "-m", "runner.guest.build_report"]
    return argv[3:]


def test_the_builds_the_deploy_names_are_the_ones_the_guest_reads() -> None:
    argv = _report_argv(BUILDS)
    assert argv[0] == "/var/lib/bench/builds"
    assert read_builds(argv[1:]) == list(BUILDS)


def test_the_guest_reports_each_build_the_deploy_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "git-leak-recovery.log").write_text(APT_MISS)
    (tmp_path / "git-leak-recovery.failed").write_text(f"{TIMED_OUT}\n")
    labels = {"localhost/x:frozen": "sha256:b=c"}
    monkeypatch.setattr(build_report, "_label", lambda image: labels.get(image, ""))
    argv = _report_argv(BUILDS)
    assert build_report.main([str(tmp_path), *argv[1:]]) == 1
    table = capsys.readouterr().err.splitlines()
    assert table[0] == "1 of 2 task images did not build:"
    assert table[2].split()[:2] == ["git-leak-recovery", "build"]
    assert "ran past its build timeout (600 s)" in table[2]


def test_a_build_the_guest_cannot_read_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_form = "git-leak-recovery=localhost/x:frozen=sha256:in=600"
    assert build_report.main([str(tmp_path), old_form]) == 2
    error = capsys.readouterr().err
    assert error.startswith("build report: a build: ") and error.count("\n") == 1


CLONES = """STEP 3/4: RUN bash /app/setup.sh
Cloning into 'personal-site'...
fatal: unable to access 'https://github.com/TheMikeMerrill/personal-site.git/': Could not resolve host: github.com
Error: building at STEP "RUN bash /app/setup.sh": while running runtime: exit status 128
"""


@pytest.mark.parametrize("required_built", [True, False])
def test_a_build_the_lock_tolerates_is_named_and_stops_the_deploy_only_beside_another(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    required_built: bool,
) -> None:
    # tasks.needs_network: the build may fail here; a build that must succeed still must.
    needs_network = BUILDS[0].model_copy(update={"tolerated": "needs the network: clones"})
    (tmp_path / "git-leak-recovery.log").write_text(CLONES)
    (tmp_path / "git-leak-recovery.failed").write_text("128\n")
    (tmp_path / "it's=odd $HOME.log").write_text(APT_MISS)
    (tmp_path / "it's=odd $HOME.failed").write_text("100\n")
    labels = {"localhost/x:frozen": "sha256:b=c"} if required_built else {}
    monkeypatch.setattr(build_report, "_label", lambda image: labels.get(image, ""))
    argv = _report_argv((needs_network, BUILDS[1]))
    assert build_report.main([str(tmp_path), *argv[1:]]) == (0 if required_built else 1)
    out, err = capsys.readouterr()
    rows = err.splitlines()
    assert rows[2].split()[:2] == ["git-leak-recovery", "build"]
    assert rows[2].endswith(
        "Could not resolve host: github.com (tolerated: needs the network: clones)"
    )
    if required_built:
        assert rows[0] == "1 of 2 task images did not build:"
        assert out == "1 of 2 task images built\n"
    else:
        assert rows[0] == "2 of 2 task images did not build:"
        assert "tolerated" not in rows[3] and out == ""


def test_a_tolerated_build_does_not_keep_a_deploy_from_changing_nothing() -> None:
    needs_network = BUILDS[0].model_copy(update={"tolerated": "needs the network"})
    host = local_host({})
    labels = {"localhost/x:frozen": "sha256:b=c"}
    host.get_fact = lambda fact, image, **_kwargs: labels.get(image, "")  # type: ignore[method-assign]
    assert yielded(host, guest_ops.task_images_built, images=(needs_network, BUILDS[1])) == []
    unbuilt = BUILDS[1].model_copy(update={"inputs_digest": "sha256:other"})
    assert len(yielded(host, guest_ops.task_images_built, images=(needs_network, unbuilt))) == 1
