"""The code gates of the fast tier: ruff (lint and format), mypy (strict) and import-linter's
contracts (pyproject.toml's [tool.importlinter]), each run with this interpreter's own modules
against this checkout; and proof that a wrong import does break a contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("runner", "deploy", "images")
LINT_IMPORTS = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
    "--no-cache",
]
ROOMS_CONTRACT = "Rooms of runner/, highest first: a room imports only rooms below it"


def _gate(command: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    # The checkout first on sys.path: an editable install of another checkout is not analysed.
    environment = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy", *PACKAGES],  # strict = true in pyproject.toml
    ],
    ids=lambda command: " ".join(command),
)
def test_gate_passes(command: list[str]) -> None:
    result = _gate([sys.executable, "-m", *command])
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"


def test_import_contracts_are_kept() -> None:
    result = _gate(LINT_IMPORTS)
    assert result.returncode == 0, f"lint-imports:\n{result.stdout}{result.stderr}"
    assert "0 broken" in result.stdout, result.stdout


def test_a_wrong_import_breaks_the_rooms_contract(tmp_path: Path) -> None:
    """core, the lowest room, importing run (a higher one) in a copy of the tree."""
    ignore = shutil.ignore_patterns("__pycache__")
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    canonical = tmp_path / "runner" / "core" / "canonical.py"
    canonical.write_text(canonical.read_text() + "\nfrom runner.run import execute  # noqa\n")

    result = _gate(LINT_IMPORTS, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"{ROOMS_CONTRACT} BROKEN" in " ".join(output.split()), output
    assert "runner.core.canonical -> runner.run" in output, output
