"""The code gates of the fast tier: ruff (lint and format), mypy (strict) and import-linter's
contracts (pyproject.toml's [tool.importlinter]), each run with this interpreter's own modules
against this checkout; and proof that a wrong import does break a contract. And no write that
skips validation: pydantic's ``model_copy(update=...)`` checks nothing (runner.core.models.updated
does)."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("core.canonical", "run.execute"),  # the lowest room importing orchestration
        ("scan.layers", "report.stats"),  # the scan importing the report that reads scan.json
        ("report.stats", "archive.check"),  # the report importing the check that recomputes it
        ("archive.check", "run.execute"),  # the archive importing orchestration
    ],
)
def test_a_wrong_import_breaks_the_rooms_contract(
    tmp_path: Path, module: str, imported: str
) -> None:
    """A room importing a higher one, in a copy of the tree."""
    ignore = shutil.ignore_patterns("__pycache__")
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    source = tmp_path / "runner" / (module.replace(".", "/") + ".py")
    source.write_text(source.read_text() + f"\nimport runner.{imported}  # noqa\n")

    result = _gate(LINT_IMPORTS, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"{ROOMS_CONTRACT} BROKEN" in " ".join(output.split()), output
    assert f"runner.{module} -> runner.{imported.split('.')[0]}" in output, output


def unvalidated_updates(source: str, filename: str) -> list[str]:
    """``file:line`` of each ``.model_copy(update=...)`` call in ``source``."""
    return [
        f"{filename}:{node.lineno}"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "model_copy"
        and any(keyword.arg == "update" for keyword in node.keywords)
    ]


def test_no_model_copy_with_an_update_in_the_code() -> None:
    found = [
        hit
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for hit in unvalidated_updates(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], f"use runner.core.models.updated, which validates: {found}"


def test_the_update_gate_finds_a_model_copy_with_an_update() -> None:
    source = (
        "record = record.model_copy(\n    update={'status': 'finshed'}\n)\nrecord.model_copy()\n"
    )
    assert unvalidated_updates(source, "planted.py") == ["planted.py:1"]
