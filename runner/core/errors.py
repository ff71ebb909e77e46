"""Errors a user can act on. The CLI prints each as one line and exits with its code."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError


class RunnerError(Exception):
    """A failure explained in one line; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class InputError(RunnerError):
    """Bad input (a malformed lock, a missing file): exit code 2."""

    exit_code = 2


def describe_validation_error(source: Path | str, error: ValidationError) -> str:
    """One line naming the file, the first failing field and the problem."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    more = len(error.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {field}: {message}{tail}"


def terminal_safe(text: str, newlines: bool = False) -> str:
    """``text`` with every control character (ESC, CR, backspace, ...) shown as an escape: a
    name from an archive or a guest must never repaint the line a person reads. ``newlines``:
    keep the newline, for an error that lists several findings one a line (a verdict that must
    be one line keeps none)."""
    kept = " \n" if newlines else " "
    return "".join(
        char if char.isprintable() or char in kept else repr(char)[1:-1] for char in text
    )
