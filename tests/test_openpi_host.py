"""OpenPI 0.3.0 from its git source (the bundle stands in for GitHub, see conftest): packed
reproducibly, its dependencies at its own bun.lock's versions, and loaded by the real Pi 0.84.2
on the host through the proxy, with no network attempt of its own at start-up.

A test that resolves the tree with npm, or installs it (``npm ci``) or Node on the host, asks
the npm registry: ``registry`` (scripts/test.sh full). Packing and the git refusals are not."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from runner.artifacts.git import GitSourceError, pack_git
from runner.artifacts.hosttools import runtime_binary
from runner.artifacts.resolver import UnavailableArtifacts, resolve_lock
from runner.cache.paths import CachePaths
from runner.cache.store import ArtifactStore
from runner.core.files import read_model
from runner.guest.agent_plan import CONTAINER, AgentPlan, registered_extensions
from runner.guest.harness_config import BEARER_ENV, agent_command, models_config, models_file_name
from runner.provider.script import ProviderScript, ToolCall, Turn
from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths
from runner.records.prompt import PromptFootprint
from runner.spec.lock import Lock, PinnedPackage, load_lock
from runner.spec.resolution import Resolution, lockfile_path
from tests.conftest import OPENPI_URL
from tests.support.proxy_fixtures import KEY_ENV, scripted_model
from tests.test_pi_host import WRITE_ANSWER

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "locks" / "demo.toml"
RESOLVED = REPO / "locks" / "demo.resolved.json"
COMMIT = "4eced51bac70ae484149e2dd4ff88b307ca6548f"
OPENPI = PinnedPackage(
    source=f"git+{OPENPI_URL}#{COMMIT}",
    tag="v0.3.0",
    name="@tt-a1i/openpi",
    settings={"my-pi-setup.json": {"capabilities": {"discovery": "adaptive"}}},
)
# Its own bun.lock's versions of what broke under its semver ranges (effect 4.1.0).
BUN_LOCK = {
    "effect": "4.0.0-beta.103",
    "@effect/platform-node": "4.0.0-beta.103",
    "@effect/platform-node-shared": "4.0.0-beta.103",
    "acorn": "8.17.0",
}
EXTENSIONS = 22
PI_TOOLS = ("read", "bash", "edit", "write")
OPENPI_GROUPS = ("search", "delegate", "workflow", "background", "session")
# What the model loads through OpenPI's gateway, then calls: each must work offline.
OPENPI_TURN = ProviderScript(
    name="openpi-tools",
    turns=(
        Turn(
            tool_calls=(
                ToolCall(tool="openpi_load_tools", arguments={"groups": list(OPENPI_GROUPS)}),
            )
        ),
        Turn(
            tool_calls=(
                ToolCall(tool="fd", arguments={"pattern": "seed"}),
                ToolCall(tool="rg", arguments={"pattern": "seed"}),
                ToolCall(tool="bg_start", arguments={"command": "echo bg-done", "title": "probe"}),
                ToolCall(tool="tasks_add", arguments={"items": [{"subject": "Write the answer"}]}),
            )
        ),
        *WRITE_ANSWER.turns,
    ),
    final_text=WRITE_ANSWER.final_text,
)


def _harnesses(lock: Lock, harness_id: str) -> Lock:
    chosen = tuple(h for h in lock.harnesses if h.id == harness_id)
    return lock.model_copy(update={"harnesses": chosen})


@pytest.mark.registry
def test_openpi_resolves_from_git_at_its_own_lockfile_versions(tmp_path: Path) -> None:
    store = ArtifactStore(CachePaths(tmp_path))
    first, second = (asyncio.run(pack_git(OPENPI, store)).record for _ in range(2))
    assert first == second  # the same bytes from two packs
    recorded = read_model(RESOLVED, Resolution)
    (expected,) = recorded.git_packages
    assert first == expected
    assert (first.own_lockfile, first.packed_with.split()[0]) == ("bun.lock", "npm")

    lock = _harnesses(load_lock(DEMO), "pi-openpi")
    console = Console(quiet=True)
    resolved = asyncio.run(
        resolve_lock(lock, REPO, CachePaths(tmp_path), console, frozenset({"harnesses"}))
    )
    (tree,) = resolved.resolution.harness_trees
    frozen = next(t for t in recorded.harness_trees if t.harness == "pi-openpi")
    # OpenPI's own lockfile versions are what a fresh resolution must give again. The tree's
    # npm lockfile is not compared: a fresh resolution (as --update) takes the registry's newest
    # versions inside Pi's own ranges, so its digest moves when npm publishes (it did on
    # 2026-12-02); the committed resolution freezes it, and `runner resolve` never re-resolves.
    assert (tree.sources, tree.overrides) == (frozen.sources, frozen.overrides)
    lockfile = json.loads(store.blob(tree.lockfile).read_bytes())
    versions = {name: lockfile["packages"][f"node_modules/{name}"]["version"] for name in BUN_LOCK}
    assert versions == BUN_LOCK
    tarball = next(a for a in resolved.resolution.artifacts if a.name == "@tt-a1i/openpi")
    assert (tarball.sha256, tarball.url) == (expected.sha256, OPENPI.source)


@pytest.mark.usefixtures("recorded_registries")  # Pi's pin checked on loopback
def test_a_commit_the_remote_does_not_have_fails_closed(tmp_path: Path) -> None:
    missing = "0" * 40
    package = PinnedPackage(source=f"git+{OPENPI_URL}#{missing}", name="@tt-a1i/openpi")
    lock = _harnesses(load_lock(DEMO), "pi-openpi")
    (harness,) = lock.harnesses
    lock = lock.model_copy(
        update={"harnesses": (harness.model_copy(update={"extensions": (package,)}),)}
    )
    with pytest.raises(UnavailableArtifacts) as failure:
        asyncio.run(
            resolve_lock(
                lock, REPO, CachePaths(tmp_path), Console(quiet=True), frozenset({"harnesses"})
            )
        )
    (line,) = failure.value.lines
    assert line.startswith(
        f"{package.source}: the remote {OPENPI_URL} does not have commit {missing} (git fetch"
    )
    assert "\n" not in line


def test_a_tag_the_remote_does_not_have_fails_closed(tmp_path: Path) -> None:
    package = PinnedPackage(source=f"git+{OPENPI_URL}#{COMMIT}", tag="v9.9.9", name="x")
    with pytest.raises(GitSourceError, match=r"has no tag v9\.9\.9$"):
        asyncio.run(pack_git(package, ArtifactStore(CachePaths(tmp_path))))


@dataclass
class ConnectionRecorder:
    """A loopback listener standing in for an HTTP(S) proxy: it records every connection."""

    server: socket.socket = field(default_factory=socket.socket)
    connections: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            client.settimeout(2)
            try:
                self.connections.append(client.recv(200))
            except OSError:
                self.connections.append(b"")
            client.close()


@pytest.fixture(scope="module")
def openpi_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frozen Pi + OpenPI tree (the committed lockfile, the packed tarball) installed on the
    host by ``npm ci`` for the host's platform, as the guest's bundle is for its own."""
    resolution = read_model(RESOLVED, Resolution)
    (record,) = resolution.git_packages
    work = tmp_path_factory.mktemp("openpi-tree")
    store = ArtifactStore(CachePaths(work / "cache"))
    packed = asyncio.run(pack_git(OPENPI, store)).record
    assert packed.sha256 == record.sha256
    tree = work / "tree"
    (tree / "tarballs").mkdir(parents=True)
    shutil.copyfile(store.blob(packed.sha256), tree / "tarballs" / packed.filename)
    lockfile = json.loads(lockfile_path(RESOLVED, "pi-openpi").read_text())
    frozen = next(t for t in resolution.harness_trees if t.harness == "pi-openpi")
    (tree / "package.json").write_text(json.dumps(frozen.package_json(lockfile)))
    (tree / "package-lock.json").write_text(json.dumps(lockfile))
    subprocess.run(
        ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=tree, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return tree


@dataclass(frozen=True)
class Started:
    returncode: int
    stderr: str
    first_request: object
    stdout: str = ""

    def tool_results(self) -> list[tuple[str, bool, str]]:
        """(tool, is_error, text) of each tool result in the JSON event log."""
        results = []
        for line in self.stdout.splitlines():
            event = json.loads(line) if line.startswith("{") else {}
            message = event.get("message", {}) if event.get("type") == "message_end" else {}
            if message.get("role") == "toolResult":
                text = "".join(c.get("text", "") for c in message["content"] if "text" in c)
                results.append((message["toolName"], message["isError"], text))
        return results


def _run_pi(
    tree: Path | None,
    tmp_path: Path,
    recorder: ConnectionRecorder,
    extension: bool,
    script: ProviderScript = WRITE_ANSWER,
    trace: Path | None = None,
    tmpdir: Path | None = None,
    arguments: tuple[str, ...] | None = None,
) -> tuple[Started, object]:
    """Pi (with OpenPI installed when ``extension``) through a real proxy; with ``trace``, under
    strace, every socket connect and datagram send of it and its children written there; with
    ``tmpdir``, its TMPDIR (where jiti compiles to); with ``arguments``, Pi started on those
    instead of the scripted prompt."""
    lock = load_lock(DEMO)
    node = runtime_binary("node", lock.tools.node)
    pi = (
        tree / "node_modules" / ".bin" / "pi"
        if tree is not None
        else pytest.importorskip("tests.test_pi_host")._installed("pi").command
    )
    agent_dir, work = tmp_path / "agent", tmp_path / "work"
    agent_dir.mkdir(parents=True)
    work.mkdir()
    (work / "seed.txt").write_text("seed\n")
    model = scripted_model()
    env = {
        "PATH": f"{node.parent}:/usr/bin:/bin",  # Debian's rg and fdfind in /usr/bin
        "HOME": str(tmp_path),
        "PI_CODING_AGENT_DIR": str(agent_dir),
        "PI_OFFLINE": "1",
        "PI_TIMING": "1",
        "HTTPS_PROXY": recorder.url,
        "HTTP_PROXY": recorder.url,
        "https_proxy": recorder.url,
        "http_proxy": recorder.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        KEY_ENV: os.environ[KEY_ENV],
        **({"TMPDIR": str(tmpdir)} if tmpdir else {}),
    }
    if extension:
        assert tree is not None
        installed = subprocess.run(
            [str(pi), "install", str(tree / "node_modules" / "@tt-a1i" / "openpi")],
            env=env, cwd=work, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        for file_name, content in OPENPI.settings.items():
            (agent_dir / file_name).write_text(json.dumps(content))  # as the run script
    paths = RunPaths(tmp_path / "run")
    with CredentialProxy(paths) as proxy:
        from datetime import UTC, datetime, timedelta

        bearer = proxy.open_cell("cell-1", model, datetime.now(UTC) + timedelta(minutes=5), script)
        (agent_dir / models_file_name("pi")).write_text(
            json.dumps(models_config("pi", model, proxy.base_url))
        )
        traced = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", str(trace)]
        done = subprocess.run(
            [*(traced if trace else []), str(pi),
             *(arguments or agent_command(model, "Write the answer."))],
            env={**env, BEARER_ENV: bearer}, cwd=work, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        counts = proxy.close_cell("cell-1")
    return Started(done.returncode, done.stderr, counts.first_request, done.stdout), counts


_INET = re.compile(
    r'sin6?_port=htons\((\d+)\), (?:sin_addr=inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")'
)


def _inet_destinations(strace_output: str) -> set[tuple[str, int]]:
    """(address, port) of every AF_INET/AF_INET6 connect, sendto or sendmsg strace printed."""
    found = set()
    for match in _INET.finditer(strace_output):
        port, v4, v6 = match.groups()
        found.add((v4 or v6, int(port)))
    return found


@pytest.fixture
def provider_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, "sk-host-test-" + os.urandom(16).hex())
    yield


@pytest.mark.registry
@pytest.mark.usefixtures("provider_key")
def test_pi_loads_all_openpi_extensions_and_offers_their_tools(
    openpi_tree: Path, tmp_path: Path
) -> None:
    recorder = ConnectionRecorder()
    traces = tmp_path / "bare.strace", tmp_path / "openpi.strace"
    bare, _ = _run_pi(openpi_tree, tmp_path / "bare", recorder, False, trace=traces[0])
    with_openpi, _ = _run_pi(openpi_tree, tmp_path / "openpi", recorder, True, trace=traces[1])
    assert bare.returncode == 0, bare.stderr
    assert with_openpi.returncode == 0, with_openpi.stderr
    assert "Cannot find module" not in with_openpi.stderr
    loaded = [line for line in with_openpi.stderr.splitlines() if "openpi/extensions/" in line]
    extensions = {line.split("openpi/extensions/")[1].split("/")[0] for line in loaded}
    assert len(extensions) == EXTENSIONS, with_openpi.stderr
    bare_first, openpi_first = bare.first_request, with_openpi.first_request
    assert isinstance(bare_first, PromptFootprint) and isinstance(openpi_first, PromptFootprint)
    print(f"bare: {bare_first}\nopenpi: {openpi_first}")
    assert recorder.connections == []  # nothing but the proxy was reached
    # Issue #12: Pi's and OpenPI's start-up make no network attempt but to the proxy: every inet
    # connect or datagram the kernel saw from them (strace -f), DNS included, went to loopback.
    for trace in traces:
        destinations = _inet_destinations(trace.read_text())
        print(f"{trace.name}: {sorted(destinations)}")
        assert destinations and all(address == "127.0.0.1" for address, _ in destinations)
        assert not any(port == 53 for _, port in destinations)
    assert openpi_first.overhead_bytes > bare_first.overhead_bytes
    # Bare Pi: its four tools. OpenPI in "adaptive" discovery adds its gateway alone (its
    # bash/edit/write re-registrations keep Pi's names and schemas, only the TUI renderers change).
    assert bare_first.tool_names == PI_TOOLS
    assert openpi_first.tool_names == (*PI_TOOLS, "openpi_load_tools")


@pytest.mark.registry
@pytest.mark.usefixtures("provider_key")
def test_openpi_tools_load_and_run_offline(openpi_tree: Path, tmp_path: Path) -> None:
    recorder = ConnectionRecorder()
    run, _ = _run_pi(openpi_tree, tmp_path, recorder, extension=True, script=OPENPI_TURN)
    assert run.returncode == 0, run.stderr
    assert recorder.connections == []
    results = run.tool_results()
    assert [(tool, error) for tool, error, _ in results] == [
        ("openpi_load_tools", False),
        ("fd", False),
        ("rg", False),
        ("bg_start", False),
        ("tasks_add", False),
        ("bash", False),
    ], results
    loaded = results[0][2]
    for tool in ("fd", "rg", "subagent_spawn", "workflow", "bg_start", "tasks_add", "create_goal"):
        assert tool in loaded.split("Activated tools: ")[1].split(".")[0], loaded
    assert "seed.txt" in results[1][2] and "seed" in results[2][2]


@pytest.mark.registry
def test_the_written_registration_is_what_pi_install_writes(
    openpi_tree: Path, tmp_path: Path
) -> None:
    """The run script writes OpenPI's registration (agent_plan.registered_extensions)
    instead of running `pi install` in every cell: the bytes Pi 0.84.2's own install leaves in a
    fresh agent dir, for the same paths as in a task container (under a common root here)."""
    lock = load_lock(DEMO)
    harness = next(h for h in lock.harnesses if h.id == "pi-openpi")
    plan = AgentPlan(
        harness=harness,
        model=lock.models[0],
        runtime_version=lock.tools.node,
        artifacts_dir="/bench/artifacts",
        proxy_base_url="http://127.0.0.1:1",
    )
    root = tmp_path / "container"
    tree = root / plan.harness_tree.relative_to("/")
    shutil.copytree(openpi_tree, tree, symlinks=True, copy_function=os.link)
    agent_dir = root / CONTAINER.agent_dir.relative_to("/")
    agent_dir.mkdir(parents=True)
    node = runtime_binary("node", lock.tools.node)
    for extension in harness.extensions:
        installed = subprocess.run(
            [str(tree / "node_modules/.bin/pi"), "install",
             str(tree / "node_modules" / str(extension.package_name))],
            env={"PATH": f"{node.parent}:/usr/bin:/bin", "HOME": str(tmp_path),
                 "PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1"},
            cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
    assert sorted(p.name for p in agent_dir.iterdir()) == ["settings.json"]
    assert (agent_dir / "settings.json").read_text() == registered_extensions(plan)


@pytest.mark.registry
@pytest.mark.usefixtures("provider_key")
def test_a_cache_warmed_on_help_is_everything_a_run_compiles(
    openpi_tree: Path, tmp_path: Path
) -> None:
    """compiled_cache = "warm": the deploy's warm script starts Pi with OpenPI on ``--help``
    (agent_plan.warm_script), which compiles every extension into $TMPDIR/jiti; a run of OpenPI's
    tools that starts from a copy of those files compiles nothing more and rewrites none."""
    recorder = ConnectionRecorder()
    warm, cell = tmp_path / "warm-tmp", tmp_path / "cell-tmp"
    warm.mkdir()
    helped, _ = _run_pi(
        openpi_tree, tmp_path / "warm", recorder, True, tmpdir=warm, arguments=("--help",)
    )
    assert helped.returncode == 0, helped.stderr
    compiled = {path.name: path.read_bytes() for path in (warm / "jiti").iterdir()}
    assert len(compiled) >= EXTENSIONS, sorted(compiled)
    shutil.copytree(warm / "jiti", cell / "jiti")
    run, _ = _run_pi(
        openpi_tree, tmp_path / "cell", recorder, True, script=OPENPI_TURN, tmpdir=cell
    )
    assert run.returncode == 0, run.stderr
    assert [error for _, error, _ in run.tool_results()] == [False] * 6
    after = {path.name: path.read_bytes() for path in (cell / "jiti").iterdir()}
    assert after == compiled
    assert recorder.connections == []
