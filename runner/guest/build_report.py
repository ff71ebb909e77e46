"""Which task images failed to build, and each failure's own line: run in the guest after every
task image's build was tried, so one deploy names every broken task, not only the first.

    python -m runner.guest.build_report LOG_DIR BUILD_JSON ...

Each BUILD_JSON is a task image's build as the deploy gives it (runner.guest.task_images'
``TaskImageBuild`` as JSON, one argument each).

Each build left ``LOG_DIR/<task>.log`` (its whole output) and, when it failed, ``<task>.failed``
(its exit status). A task whose image is not labelled with its inputs' digest afterwards is a
failure too (a build that never ran). Prints the table to stderr and exits 1 when any failed
that the lock does not tolerate (tasks.needs_network: named in the table, with why).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from runner.core.errors import describe_validation_error
from runner.core.text_table import text_table
from runner.guest.task_images import TaskImageBuild

# `timeout`'s exit status when the build ran past its limit (and was stopped).
TIMED_OUT = 124
# A failure's own line, most telling first: the package manager's or compiler's words; else
# the step's last line before Podman's "Error: building at STEP" that every failed step ends with.
_CAUSES = (
    re.compile(r"^E: .+$", re.MULTILINE),  # apt
    re.compile(r"^ERROR: .+$", re.MULTILINE),  # pip
    re.compile(r"^(?:npm ERR!|npm error) .+$", re.MULTILINE),
    re.compile(r"^.*\b(?:error(?:\[\w+\])?|fatal error|fatal): .+$", re.MULTILINE),
    re.compile(r"^.*: (?:command not found|not found)$", re.MULTILINE),
)
_PODMAN_STEP_FAILED = "Error: building at STEP"
_PODMAN_OWN = ("STEP ", "--> ", "COMMIT ", _PODMAN_STEP_FAILED)
# What a package manager says of a package the mirror's frozen set does not have.
_MISSING = (
    re.compile(r"^E: Unable to locate package (\S+)", re.MULTILINE),
    re.compile(r"^E: Package '([^']+)' has no installation candidate", re.MULTILINE),
    re.compile(r"^E: Version '[^']+' for '([^']+)' was not found", re.MULTILINE),
    re.compile(r"^ERROR: No matching distribution found for (\S+)", re.MULTILINE),
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class BuildFailure:
    task: str
    line: str
    missing: tuple[str, ...]
    tolerated: str = ""  # why the lock lets it fail here (tasks.needs_network)


def failure_line(log: str, status: int | None, timeout_seconds: float | None = None) -> str:
    """The one line that says why a build failed."""
    if status == TIMED_OUT:
        limit = f" ({timeout_seconds:g} s)" if timeout_seconds else ""
        return (
            f"stopped: ran past its build timeout{limit} (task.toml's build_timeout_sec, times "
            "the lock's tasks.environment_build_timeout_multiplier)"
        )
    text = _ANSI.sub("", log)
    if dpkg := _dpkg_script_error(text):
        return dpkg[:300]
    for cause in _CAUSES:
        if found := cause.search(text):
            return found.group(0).strip()[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    failed_at = next(
        (at for at in range(len(lines) - 1, -1, -1) if lines[at].startswith(_PODMAN_STEP_FAILED)),
        None,
    )
    if failed_at is not None:
        own = [line for line in lines[:failed_at] if not line.startswith(_PODMAN_OWN)]
        return (own[-1] if own else lines[failed_at])[:300]
    return lines[-1][:300] if lines else f"no output (exit status {status})"


def _dpkg_script_error(text: str) -> str | None:
    """A package's maintainer script that failed: its own last words, the line before dpkg's
    "error processing package" (apt then only says dpkg returned an error code)."""
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if line.startswith("dpkg: error processing package") and at > 0:
            return lines[at - 1].strip() or line.strip()
    return None


def missing_packages(log: str) -> tuple[str, ...]:
    """The packages a failed build asked for that the frozen set does not have."""
    names = (match for pattern in _MISSING for match in pattern.findall(log))
    return tuple(dict.fromkeys(names))


def failure_table(failures: list[BuildFailure], tried: int) -> str:
    """``task  step  error`` rows; a tolerated failure says why the lock lets it fail."""
    rows = [f"{len(failures)} of {tried} task images did not build:"]
    rows += text_table(
        ("task", "step", "error"),
        [
            (f.task, "build", f"{f.line} (tolerated: {f.tolerated})" if f.tolerated else f.line)
            for f in failures
        ],
    )
    for failure in failures:
        if failure.missing:
            rows.append(
                f"  task {failure.task}: the lab's frozen package set has no "
                f"{', '.join(failure.missing)}: record what its build takes with "
                "'runner resolve LOCK --lab LAB', then deploy again"
            )
    return "\n".join(rows)


def _label(image: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", '{{index .Labels "bench.inputs"}}', image],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def _failure(log_dir: Path, build: TaskImageBuild) -> BuildFailure:
    task = build.task
    log_file, failed = log_dir / f"{task}.log", log_dir / f"{task}.failed"
    log = log_file.read_text(errors="replace") if log_file.is_file() else ""
    status = int(failed.read_text().strip() or 1) if failed.is_file() else None
    if status is None and not log:
        line = "no image and no build log: the build did not run"
    else:
        line = failure_line(log, status, build.build_timeout_sec)
    return BuildFailure(task, line, missing_packages(log), build.tolerated)


def read_builds(arguments: list[str]) -> list[TaskImageBuild]:
    """The builds the deploy named, one ``TaskImageBuild`` JSON an argument."""
    return [TaskImageBuild.model_validate_json(argument) for argument in arguments]


def main(argv: list[str]) -> int:
    try:
        log_dir, builds = Path(argv[0]), read_builds(argv[1:])
    except ValidationError as error:
        print(describe_validation_error("build report: a build", error), file=sys.stderr)
        return 2
    failures = [
        _failure(log_dir, build) for build in builds if _label(build.image) != build.inputs_digest
    ]
    if failures:
        print(failure_table(failures, len(builds)), file=sys.stderr)
    if any(not failure.tolerated for failure in failures):
        return 1
    print(f"{len(builds) - len(failures)} of {len(builds)} task images built")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
