"""``pip install .`` (not editable) gives a working ``runner``: the wheel carries every file the
code reads beside its modules (runner/freeze/scope.toml, deploy/templates/domain.xml,
images/guest/**, images/initramfs/init), with their executable bits.

No network: the wheel is built without build isolation (the running environment's setuptools;
one that cannot build wheels makes pip build in isolation instead) and installed with
``--no-deps --no-index`` into a fresh venv that sees the running environment's packages for the
dependencies. The venv must import the project from its own site-packages, not from the
checkout or an editable install, or the test would prove nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest

from images.recipe import recipe_file_digests

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("runner", "deploy", "images")
DATA_FILES = (
    "runner/freeze/scope.toml",
    "runner/report/templates/report.html.j2",
    "deploy/templates/domain.xml",
    "images/initramfs/init",
    "images/guest/usr/local/sbin/lab-authorized-key",
    "images/guest/usr/local/sbin/lab-host-key",
    "images/guest/etc/ssh/sshd_config.d/bench.conf",
)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")

# What the venv's Python reports about the installed project (run with the venv's interpreter).
PROBE = """
import json, sys
from importlib import resources
import deploy, images, runner
from images.recipe import recipe_file_digests
print(json.dumps({
    "prefix": sys.prefix,
    "files": {m.__name__: m.__file__ for m in (runner, deploy, images)},
    "scope": resources.files("runner").joinpath("freeze/scope.toml").is_file(),
    "template": resources.files("deploy").joinpath("templates/domain.xml").is_file(),
    "recipe_files": recipe_file_digests(),
}))
"""


def _run(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _package_files(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for package in PACKAGES
        for path in (root / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def _build_options() -> list[str]:
    """Without isolation and without an index when the running setuptools builds wheels itself
    (>= 70.1, the [dev] extra's; or the ``wheel`` package is there); else pip's isolated build,
    which fetches the build-system's setuptools from the configured index."""
    if find_spec("setuptools.command.bdist_wheel") or find_spec("wheel"):
        return ["--no-build-isolation", "--no-index"]
    return []


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the venv it is installed in)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy: an in-tree build would leave build/ and *.egg-info here
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=IGNORED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    build = ["wheel", "-q", "--no-deps", *_build_options(), "-w", str(work / "dist"), str(source)]
    _run([sys.executable, "-m", "pip", *build])
    (wheel,) = (work / "dist").glob("frozen_bench_runner-*.whl")

    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    if sys.prefix != sys.base_prefix:
        # Run from a venv (.venv of setup-host.sh): --system-site-packages reaches only the base
        # interpreter's site, so the running venv's site-packages are added by plain path lines
        # (these are not scanned for .pth files: its editable install stays out).
        purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
        (purelib / "_running_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--ignore-installed",  # the running environment's editable install is not this venv's
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
    )
    return wheel, venv


def _venv_environment(venv: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["PATH"] = f"{venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
    return environment


def test_wheel_carries_the_package_data(wheel_venv: tuple[Path, Path]) -> None:
    wheel, _ = wheel_venv
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
    assert set(DATA_FILES) <= names, sorted(set(DATA_FILES) - names)
    # Every file of the three package trees ships: modules and data alike.
    missing = _package_files(REPO) - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for executable in (
        "images/initramfs/init",
        "images/guest/usr/local/sbin/lab-authorized-key",
        "images/guest/usr/local/sbin/lab-host-key",
    ):
        assert modes[executable] & 0o111, f"{executable} lost its executable bit in the wheel"


def test_installed_wheel_runs_from_its_own_site_packages(wheel_venv: tuple[Path, Path]) -> None:
    _, venv = wheel_venv
    environment = _venv_environment(venv)
    # -I: no working directory (the checkout) on sys.path, as for the console script ``runner``.
    probe = _run([str(venv / "bin" / "python"), "-I", "-c", PROBE], cwd=REPO, env=environment)
    found = json.loads(probe.stdout)
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": found["prefix"]}))
    for module, file in found["files"].items():
        assert Path(file).is_relative_to(site_packages), f"{module} imported from {file}"
    assert found["scope"] and found["template"]
    # images/ files as the image input hash sees them: same content, same +x, none missing.
    assert found["recipe_files"] == recipe_file_digests()

    help_text = _run([str(venv / "bin" / "runner"), "--help"], cwd=REPO, env=environment)
    assert "schedule" in help_text.stdout


def test_installed_runner_schedule_equals_the_checkouts(
    wheel_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """From the wheel, REPO_ROOT is the working directory: run in the repository, as documented."""
    _, venv = wheel_venv
    lock = "locks/seed-54.toml"
    installed = _run(
        [str(venv / "bin" / "runner"), "schedule", lock, "--out", str(tmp_path / "wheel.json")],
        cwd=REPO,
        env=_venv_environment(venv),
    )
    checkout = _run(
        [
            sys.executable,
            "-c",
            "from runner.cli.main import main; main()",
            "schedule",
            lock,
            "--out",
            str(tmp_path / "checkout.json"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    hash_line = installed.stdout.strip().splitlines()[-1]
    assert hash_line.startswith("schedule sha256: sha256:")
    assert hash_line == checkout.stdout.strip().splitlines()[-1]
    assert (tmp_path / "wheel.json").read_bytes() == (tmp_path / "checkout.json").read_bytes()
