"""The lock: every frozen condition of a run, as a person wrote it (TOML on disk).

The lock says what was asked; what was found (artifact digests) lives in the resolution file
beside it. A relative path in a lock (a ``file:`` package, a task ``path``) is relative to the
repository root, never to the lock's own directory: a run directory keeps a byte copy of its
lock, and a resumed run must find the same files. The lock fingerprint is ``sha256:`` + sha256
of the lock's canonical JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from runner.core.canonical import canonical_json, sha256_digest
from runner.core.errors import RunnerError
from runner.core.files import read_toml_model
from runner.core.models import SHA256_PATTERN, FailureClass, FrozenModel, Slug, updated
from runner.spec.base_images import BUILD, BaseRecipe, base_recipe
from runner.spec.seeded import SEEDED_MODEL, SeededModel

SCHEMA_VERSION: Literal[1] = 1

# The base-URL scheme of the offline scripted provider (runner.provider), a stand-in for a model.
SCRIPTED_SCHEME = "scripted://"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_SHA256 = re.compile(SHA256_PATTERN)
_NPM_NAME = r"^(@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*$"
_NPM = re.compile(r"^npm:(?P<name>(@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*)@(?P<version>\d[\w.+-]*)$")
_GIT = re.compile(r"^git\+(?P<url>(https|ssh|file)://\S+?)#(?P<rev>[0-9a-f]{40})$")
_FILE = re.compile(r"^file:(?P<path>\S+)$")
_PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][\w.+-]*$")
# A base image from a registry, pinned by its manifest digest: "registry/repo@sha256:<64 hex>".
# The registry is named (a host with a dot or a port, or localhost): no default registry is
# guessed, so the same lock means the same image on every machine.
_REGISTRY_IMAGE = re.compile(
    r"^(?P<repository>(?P<registry>[a-z0-9-]+(\.[a-z0-9-]+)*(:\d+)?)(/[a-z0-9]+([._-][a-z0-9]+)*)+)"
    r"@(?P<digest>sha256:[0-9a-f]{64})$"
)


def _check_source(value: str) -> str:
    if _NPM.match(value) or _GIT.match(value) or _FILE.match(value):
        return value
    raise ValueError(
        "must be 'npm:NAME@VERSION', 'git+URL#<40-hex commit>' or 'file:PATH' (with sha256)"
    )


PackageSource = Annotated[str, AfterValidator(_check_source)]


class PinnedPackage(FrozenModel):
    """A package from its pinned source; a local tarball must carry its sha256."""

    source: PackageSource
    sha256: str | None = Field(default=None, pattern=_SHA256.pattern)
    # The package's own name (its package.json "name"), for a source that does not say it: a
    # harness registers an extension by the name it is installed under. Resolution checks it.
    name: str | None = Field(default=None, pattern=_NPM_NAME)
    # For readers of a 'git+' source: the tag that names its commit. The commit is what counts;
    # resolution fails closed when the remote's tag does not point at it.
    tag: str | None = Field(default=None, pattern=r"^[\w][\w./-]{0,127}$")
    # Files the package reads from the harness's config dir (PI_CODING_AGENT_DIR), file name ->
    # JSON content, written before the harness starts: a package's own setting that changes what
    # it offers the model is a frozen condition of the run, in the lock and its fingerprint.
    settings: dict[Annotated[str, Field(pattern=r"^[\w.-]+\.json$")], dict[str, Any]] = Field(
        default_factory=dict
    )

    LATE_FIELDS = frozenset({"tag", "settings"})

    @model_validator(mode="after")
    def _tarball_needs_digest(self) -> PinnedPackage:
        if self.source.startswith("file:") and self.sha256 is None:
            raise ValueError("a 'file:' source needs its sha256")
        if self.tag is not None and self.git_commit is None:
            raise ValueError("only a 'git+' source names a 'tag'")
        if self.name is not None and _NPM.match(self.source):
            raise ValueError("an 'npm:' source names its package itself: drop 'name'")
        return self

    @property
    def npm_name(self) -> str | None:
        """The name on the npm registry (``npm:`` sources only)."""
        match = _NPM.match(self.source)
        return match["name"] if match else None

    @property
    def package_name(self) -> str | None:
        """The name it is installed under in node_modules, where the lock says it."""
        return self.npm_name or self.name

    @property
    def version(self) -> str | None:
        match = _NPM.match(self.source)
        return match["version"] if match else None

    @property
    def git_url(self) -> str | None:
        """The repository of a ``git+URL#COMMIT`` source."""
        match = _GIT.match(self.source)
        return match["url"] if match else None

    @property
    def git_commit(self) -> str | None:
        match = _GIT.match(self.source)
        return match["rev"] if match else None


class Guest(FrozenModel):
    LATE_FIELDS = frozenset({"tool_suites"})

    arch: Literal["aarch64", "x86_64"] = "aarch64"
    suite: Slug = "trixie"
    mirror: str = Field(pattern=r"^https?://\S+$")
    cpu_model: str = "cortex-a57"
    memory_mib: int = Field(ge=512, le=65536)
    vcpus: int = Field(ge=1, le=64)
    disk_gib: int = Field(default=12, ge=4, le=512)
    source_date_epoch: int = Field(ge=0)
    packages: tuple[Slug, ...] = Field(min_length=1)
    # More suites of the same archive a pinned tool (``tools.podman``) may come from, with the
    # dependencies it needs that ``suite`` cannot satisfy; everything else stays from ``suite``.
    tool_suites: tuple[Slug, ...] = ()

    @field_validator("packages", "tool_suites")
    @classmethod
    def _unique_packages(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _reject_duplicates(value)
        return value

    @model_validator(mode="after")
    def _tool_suites_are_others(self) -> Guest:
        if self.suite in self.tool_suites:
            raise ValueError(f"tool_suites: '{self.suite}' is the guest's own suite")
        return self


class Tools(FrozenModel):
    """Pinned versions of the tools every cell runs on."""

    podman: str
    node: str
    bun: str
    harbor: str
    # The Python package index (PEP 503 "simple" API) Harbor's wheels are chosen from; tests
    # point it at a loopback index. Part of the environment inputs: another index, another set.
    python_index: str = Field(default="https://pypi.org/simple", pattern=r"^https?://\S+$")

    LATE_FIELDS = frozenset({"python_index"})

    def runtime_version(self, runtime: Literal["node", "bun"]) -> str:
        """The pinned version of a harness's runtime."""
        return self.node if runtime == "node" else self.bun


# A harness's compiled caches (OpenPI's jiti cache of its TypeScript extensions):
#   cold  every cell compiles them afresh (each cell's container starts from the frozen image,
#         the harness tree read-only): the default, what every lock without the field ran;
#   warm  compiled once at provisioning and frozen with the guest.
CompiledCache = Literal["cold", "warm"]
DEFAULT_COMPILED_CACHE: CompiledCache = "cold"


class Harness(FrozenModel):
    """One coding-agent harness: its CLI package, its runtime and any Pi packages on top."""

    LATE_FIELDS = frozenset({"compiled_cache"})

    id: Slug
    label: str = Field(min_length=1)
    agent: Literal["pi", "omp"]
    runtime: Literal["node", "bun"]
    package: PinnedPackage
    extensions: tuple[PinnedPackage, ...] = ()
    # Part of the environment fingerprint (Lock.with_environment), not of what a resolution is
    # made for: a guest frozen with warm caches is another guest of the same artifacts.
    compiled_cache: CompiledCache = DEFAULT_COMPILED_CACHE


class VerifierTools(FrozenModel):
    """``[tasks.verifier]``: what the tasks' own ``tests/test.sh`` installs at verify time, frozen
    instead. Debian packages are installed in the guest (so its userland, the tasks' local base,
    has them); uv's binaries go where its installer puts them (``/root/.local/bin``); the
    wheels are what the verifier's ``uvx -w ...`` asks for, served with their dependencies by the
    lab's package mirror (runner.lab.mirror). All of them are pinned in the resolution."""

    debs: tuple[Slug, ...] = ()
    uv: str | None = Field(default=None, pattern=r"^\d+(\.\d+)*$")
    wheels: tuple[str, ...] = Field(default=(), description="pip requirements, name==version")

    @field_validator("wheels")
    @classmethod
    def _pinned_requirements(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for requirement in value:
            if not _PINNED_REQUIREMENT.match(requirement):
                raise ValueError(f"'{requirement}' must be NAME==VERSION")
        _reject_duplicates(value)
        return value

    @property
    def requirements(self) -> tuple[str, ...]:
        """Everything pip resolves for the verifier: uv's wheel and the verifier's wheels."""
        return (*((f"uv=={self.uv}",) if self.uv else ()), *self.wheels)


@dataclass(frozen=True)
class RegistryImage:
    """A base image pulled from a registry by its manifest digest, and the FROM names it has."""

    repository: str  # registry/repo, without the digest
    digest: str  # the manifest's "sha256:<64 hex>"
    names: tuple[str, ...]

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


def registry_image(value: str) -> tuple[str, str] | None:
    """(repository, digest) of a ``registry/repo@sha256:<hex>`` value; None for a local name."""
    found = _REGISTRY_IMAGE.match(value)
    if found is None:
        return None
    registry = found["registry"]
    if "." not in registry and ":" not in registry and registry != "localhost":
        return None
    return found["repository"], found["digest"]


def _check_base_images(value: dict[str, str]) -> dict[str, str]:
    for from_name, image in value.items():
        if image == BUILD and base_recipe(from_name) is None:
            raise ValueError(
                f"{from_name} = {BUILD!r}: no recipe reads this name (built: debian:<release>, "
                "ubuntu:<version>, python:<X.Y>[-slim][-<codename>]); map it to a registry "
                "image pinned by digest or a local image"
            )
        if "@" in image and registry_image(image) is None:
            raise ValueError(
                f"{from_name} = {image!r}: a registry image must be "
                "'REGISTRY/REPO@sha256:<64 hex>' (REGISTRY with a dot or a port, or localhost)"
            )
    return value


class TaskSource(FrozenModel):
    """Terminal-Bench tasks in Harbor's format: a git repository at a commit, or a local dir.

    What the lab changes about an upstream task to run it here is declared here and nowhere
    else (runner.spec.task_derivation applies it and lists the changes): ``base_images`` maps a
    Dockerfile's ``FROM`` name to the lab's image; ``build_from_environment`` drops task.toml's
    prebuilt ``docker_image`` so the image is built from ``environment/`` for the guest's arch;
    ``verifier`` freezes what the verifier would install."""

    LATE_FIELDS = frozenset(
        {
            "build_from_environment",
            "verifier",
            "timing_sensitive",
            "needs_network",
            "environment_build_timeout_multiplier",
        }
    )

    git: str | None = Field(default=None, pattern=r"^(https|ssh|file)://\S+$")
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    path: str | None = None
    subdir: str = ""
    ids: tuple[Slug, ...] = Field(min_length=1)
    # FROM name -> a local image the guest makes itself ("localhost/base:1"), or a registry
    # image pinned by its manifest digest (RegistryImage), pulled at resolve and loaded offline.
    base_images: Annotated[dict[str, str], AfterValidator(_check_base_images)] = Field(
        default_factory=dict
    )
    build_from_environment: bool = False
    verifier: VerifierTools | None = None
    # Tasks whose verdict depends on wall-clock timing (a signal sent 0.5 s after start): under
    # emulation (QEMU TCG) their own reference solution may fail, so their oracle at the freeze
    # is recorded instead of failing it, and a lab whose oracle of the task did not score 1
    # cannot judge it: its cells' failures are indeterminate. Under KVM they are held strictly.
    timing_sensitive: tuple[Slug, ...] = ()
    # Tasks that need a host the lab never reaches (its build clones a repository from GitHub,
    # its solution downloads), each with the evidence: their image build and their oracle may
    # fail without failing the deploy or the freeze, which name them; a lab whose oracle of
    # the task did not score 1 cannot judge it. Under any acceleration: the lab is offline.
    needs_network: dict[Slug, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)
    # Harbor's own environment_build_timeout_multiplier: each task's build_timeout_sec times it,
    # in the deploy's build and the recording's. A task.toml's figure is for a native build;
    # under emulation (QEMU TCG here) an apt-get install runs many times slower. Each task
    # derived under it says so.
    environment_build_timeout_multiplier: float = Field(default=1.0, gt=0)

    def build_timeout_sec(self, own: float) -> float:
        """A task's build timeout in this lab, from its task.toml's ``own``."""
        return own * self.environment_build_timeout_multiplier

    def tolerated(self, emulated: bool) -> dict[str, str]:
        """The tasks whose build or oracle may fail in this lab without stopping it, and why
        (``emulated``: under QEMU TCG, where timing-sensitive tasks are tolerated too)."""
        timing = dict.fromkeys(self.timing_sensitive, "timing-sensitive under emulation")
        network = {task: f"needs the network: {why}" for task, why in self.needs_network.items()}
        return {**(timing if emulated else {}), **network}

    @property
    def registry_images(self) -> tuple[RegistryImage, ...]:
        """The registry base images, each with every FROM name mapped to it, by reference."""
        names: dict[tuple[str, str], list[str]] = {}
        for from_name, image in self.base_images.items():
            pinned = registry_image(image)
            if pinned is not None:
                names.setdefault(pinned, []).append(from_name)
        return tuple(
            RegistryImage(repository, digest, tuple(found))
            for (repository, digest), found in sorted(names.items())
        )

    @property
    def local_images(self) -> dict[str, str]:
        """FROM name -> local image: the substitutes the guest makes from its own userland."""
        return {
            name: image
            for name, image in self.base_images.items()
            if image != BUILD and registry_image(image) is None
        }

    @property
    def built_images(self) -> tuple[tuple[BaseRecipe, tuple[str, ...]], ...]:
        """Each image the project builds (``"build"``), with the FROM names read as it."""
        names: dict[BaseRecipe, list[str]] = {}
        for from_name, image in self.base_images.items():
            recipe = base_recipe(from_name) if image == BUILD else None
            if recipe is not None:
                names.setdefault(recipe, []).append(from_name)
        return tuple(sorted(((r, tuple(n)) for r, n in names.items()), key=lambda x: x[0].id))

    @field_validator("ids")
    @classmethod
    def _unique_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _reject_duplicates(value)
        return value

    @model_validator(mode="after")
    def _tolerated_are_tasks(self) -> TaskSource:
        for field_name, tasks in (
            ("timing_sensitive", self.timing_sensitive),
            ("needs_network", tuple(self.needs_network)),
        ):
            unknown = sorted(set(tasks) - set(self.ids))
            if unknown:
                raise ValueError(f"{field_name}: {', '.join(unknown)} not in ids")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> TaskSource:
        if (self.git is None) == (self.path is None):
            raise ValueError("give either 'git' (with 'commit') or 'path'")
        if self.git is not None and self.commit is None:
            raise ValueError("a 'git' task source needs its 'commit'")
        return self


# The wire API a model is reached by; its endpoint paths: runner.proxy.target.API_ENDPOINTS.
Api = Literal["openai-completions", "openai-responses", "anthropic-messages"]


class Model(FrozenModel):
    """A model endpoint. ``key_env`` is the NAME of the host variable holding the key."""

    LATE_FIELDS = frozenset({"ca_bundle", "seeded"})

    id: Slug
    provider: Slug
    model: str = Field(min_length=1)
    thinking: Literal["off", "minimal", "low", "medium", "high", "xhigh"]
    api: Api
    base_url: str = Field(pattern=r"^(https?|scripted)://\S+$")
    key_env: str
    ca_bundle: str | None = Field(
        default=None,
        min_length=1,
        description="a PEM file of the CA certificates the proxy trusts for an https base_url "
        "(a private CA), relative to the repository root; None: the system trust store",
    )

    @field_validator("key_env")
    @classmethod
    def _variable_name_not_key(cls, value: str) -> str:
        # Never echo the value: if it is a key, the error line must not leak it.
        if not _ENV_NAME.match(value):
            raise ValueError(
                "must be the NAME of a host environment variable (A-Z, 0-9, _), "
                "never the key itself"
            )
        return value

    # The seeded stand-in's parameters (runner.spec.seeded): only, and always, for the
    # scripted model "seeded".
    seeded: SeededModel | None = None

    @model_validator(mode="after")
    def _ca_bundle_only_for_https(self) -> Model:
        if self.ca_bundle is not None and not self.base_url.startswith("https://"):
            raise ValueError("ca_bundle is only for an https:// base_url")
        return self

    @model_validator(mode="after")
    def _seeded_only_for_the_seeded_stand_in(self) -> Model:
        seeded_stand_in = self.is_scripted and self.model == SEEDED_MODEL
        if seeded_stand_in and self.seeded is None:
            raise ValueError(f"the scripted model '{SEEDED_MODEL}' needs its 'seeded' table")
        if self.seeded is not None and not seeded_stand_in:
            raise ValueError(
                f"'seeded' is only for the scripted model '{SEEDED_MODEL}' "
                f"(base_url {SCRIPTED_SCHEME}...)"
            )
        return self

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def is_scripted(self) -> bool:
        """Answered by the offline scripted provider, not by a real model."""
        return self.base_url.startswith(SCRIPTED_SCHEME)


# Only what the agent did not cause may be re-run: an environment or verifier that could not
# start, or a provider that answered nothing but errors. A timeout, a verifier's "no" or a
# crashed harness is the agent's own result; re-running it would give it a second chance.
RETRYABLE_CLASSES: tuple[FailureClass, ...] = ("setup_failure", "verifier_setup", "model_failure")


class Retry(FrozenModel):
    """``[retry]``: which failure classes are re-run, and at most how many attempts a cell gets
    (the first included). Absent: no retries, the reference run's condition."""

    classes: tuple[FailureClass, ...] = Field(min_length=1)
    max_attempts: int = Field(ge=2, le=10)

    @field_validator("classes", mode="before")
    @classmethod
    def _only_what_the_agent_did_not_cause(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        known = get_args(FailureClass)
        for name in value:
            if name in known and name not in RETRYABLE_CLASSES:
                raise ValueError(
                    f"'{name}' is the agent's own result and is never re-run; "
                    f"only {', '.join(RETRYABLE_CLASSES)} may be"
                )
        _reject_duplicates(tuple(str(name) for name in value))
        return value


# How the schedule's cells may spread over labs, a frozen condition of the run:
#   serial          one lab, one cell at a time in schedule order (global concurrency 1): the
#                   reference run's condition and the default;
#   batch-per-host  each batch strictly serial on a lab of its own, batches of the run at the
#                   same time on different hosts of a fleet (runner.fleet). Run without a fleet,
#                   such a lock still runs serially on one lab; the receipt says which held.
Placement = Literal["serial", "batch-per-host"]


class Lock(FrozenModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: Slug
    description: str = ""
    concurrency: int
    repeats: int = Field(ge=1, le=100)
    cell_deadline_seconds: int = Field(ge=1, le=86400)
    schedule_seed: int = Field(ge=0)
    guest: Guest
    tools: Tools
    harnesses: tuple[Harness, ...] = Field(min_length=1)
    tasks: TaskSource
    models: tuple[Model, ...] = Field(min_length=1)
    retry: Retry | None = None
    placement: Placement = "serial"
    # Informational: tool versions the reference run used where the lock pins another (none of
    # the sources has them); reports print both. Not part of the environment inputs.
    reference_versions: dict[str, str] = Field(default_factory=dict)
    # Set from the lock's resolution (runner.spec.resolution.load_resolved_lock), never from TOML.
    _environment: str | None = PrivateAttr(default=None)

    LATE_FIELDS = frozenset({"retry", "reference_versions", "placement"})

    @field_validator("concurrency")
    @classmethod
    def _serial_only(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                f"must be 1: cells run strictly one at a time so wall times compare (got {value})"
            )
        return value

    @field_validator("reference_versions")
    @classmethod
    def _pinned_tools_only(cls, value: dict[str, str]) -> dict[str, str]:
        tools = sorted(set(Tools.model_fields) - {"python_index"})
        for tool in value:
            if tool not in tools:
                raise ValueError(f"'{tool}' is not a pinned tool (one of {tools})")
        return value

    @field_validator("harnesses", "models")
    @classmethod
    def _unique_ids(cls, value: tuple[Harness | Model, ...]) -> tuple[Harness | Model, ...]:
        _reject_duplicates(tuple(item.id for item in value))
        return value

    @property
    def fingerprint(self) -> str:
        return sha256_digest(canonical_json(self))

    @property
    def environment_inputs(self) -> str:
        """The part of the lock the provisioned guest is made of (guest, tools, harnesses,
        tasks), whatever its models, repeats, deadline or seed: what a resolution is made for.
        A harness's compiled caches are not in it: they change no artifact (provisioning makes
        them from the resolved ones), so asking for warm ones re-resolves nothing; they enter
        the environment fingerprint instead (``with_environment``). Nor is which tasks need the
        network (what the deploy and the freeze let fail, each score saying so in the freeze
        manifest), nor how long a build may take: they change no artifact."""
        environment = self.model_dump(
            mode="json",
            include={"schema_version", "guest", "tools", "harnesses", "tasks"},
            exclude={
                "harnesses": {"__all__": {"compiled_cache"}},
                "tasks": {"needs_network", "environment_build_timeout_multiplier"},
            },
        )
        return sha256_digest(canonical_json(environment))

    @property
    def environment_fingerprint(self) -> str:
        """What the guest is made of: the environment inputs and every resolved artifact (see
        runner.spec.resolution). A lab frozen for it can run any lock that shares it. Known
        only for a lock loaded with its resolution."""
        if self._environment is None:
            raise RunnerError(
                f"lock {self.name}: its resolution was not loaded, so its environment is unknown"
            )
        return self._environment

    def with_environment(self, resolved: str) -> Lock:
        """This lock, knowing its environment fingerprint: its resolution's, with the harnesses
        whose compiled caches it has provisioning warm when there are any (a guest frozen with
        warm caches is another guest; a lock without them keeps its resolution's fingerprint)."""
        warm = sorted(h.id for h in self.harnesses if h.compiled_cache != DEFAULT_COMPILED_CACHE)
        copy = self.model_copy()
        copy._environment = (
            sha256_digest(canonical_json({"resolution": resolved, "warm_compiled_caches": warm}))
            if warm
            else resolved
        )
        return copy

    def retries(self, failure_class: FailureClass | None, attempts_so_far: int) -> bool:
        """Whether a cell whose attempt ended in ``failure_class`` is run again, after
        ``attempts_so_far`` attempts counted against the policy."""
        policy = self.retry
        return (
            policy is not None
            and failure_class in policy.classes
            and attempts_so_far < policy.max_attempts
        )

    def for_model(self, model_id: str) -> Lock:
        """The lock narrowed to one model: what one batch of the run is frozen to."""
        models = tuple(model for model in self.models if model.id == model_id)
        return updated(self, models=models)


def _reject_duplicates(values: tuple[str, ...]) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate entry '{value}'")
        seen.add(value)


def load_lock(path: Path) -> Lock:
    """Read and validate a lock; every problem becomes one ``InputError`` line."""
    return read_toml_model(path, Lock, "lock")
