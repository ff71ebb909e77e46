"""Our one-line errors, shown by the pyinfra CLI as one line too (not as a traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra.api.exceptions import PyinfraError

from runner.core.errors import RunnerError


@contextmanager
def one_line_errors() -> Iterator[None]:
    try:
        yield
    except RunnerError as error:
        raise PyinfraError(str(error)) from None
