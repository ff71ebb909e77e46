"""Progress of a build: every tool's output goes to build.log, stage lines to the console.

Each build.log line carries the seconds since the build started, so a slow step can be found
in the log of any build (that is how the recipe's speed-ups were measured).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TextIO

from rich.console import Console

from runner.core.errors import RunnerError

# A tool silent this long is told to the console filter (``show`` in BuildLog.run) with None.
SILENCE_SECONDS = 1.0


def _lines_or_silence(stream: IO[str], seconds: float) -> Iterator[str | None]:
    """The stream's lines as they come, and None each time ``seconds`` pass without one."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)  # the end of the stream

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=seconds)
        except queue.Empty:
            yield None
            continue
        if line is None:
            return
        yield line


class BuildLog:
    def __init__(self, path: Path, console: Console) -> None:
        self.path = path
        self._console = console
        self._started = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", buffering=1)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def close(self) -> None:
        self._file.close()

    def _write(self, line: str) -> None:
        self._file.write(f"[{self.elapsed:8.1f}s] {line}\n")

    def _show(self, text: str) -> None:
        self._console.print(
            f"[{self.elapsed:7.1f}s] {text}", markup=False, highlight=False, soft_wrap=True
        )

    def stage(self, name: str, detail: str = "") -> None:
        line = f"{name}: {detail}" if detail else name
        self._write(f"=== {line}")
        self._console.print(
            f"[{self.elapsed:7.1f}s] {line}", markup=False, highlight=False, soft_wrap=True
        )

    def note(self, line: str) -> None:
        self._write(line)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        show: Callable[[str | None], list[str]] | None = None,
        omit: re.Pattern[str] | None = None,
    ) -> list[str]:
        """Run a tool, streaming its output into the log; return the lines logged.

        ``show`` maps each logged line, and None for each SILENCE_SECONDS without one, to the
        lines to show on the console (none by default); ``omit`` leaves matching lines out of
        the log (a tool that echoes tens of thousands of commands), counting them instead.
        """
        self._write("$ " + " ".join(argv))
        logged: list[str] = []
        omitted = 0
        with subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env={**os.environ, **(env or {})},
        ) as process:
            assert process.stdout is not None
            for raw in _lines_or_silence(process.stdout, SILENCE_SECONDS):
                line = None if raw is None else raw.rstrip("\n")
                if line is not None:
                    if omit is not None and omit.match(line):
                        omitted += 1
                        continue
                    logged.append(line)
                    self._write(line)
                for shown in show(line) if show else ():
                    self._show(f"  {shown}")
        if omitted:
            self._write(f"({omitted} lines left out)")
        if process.returncode != 0:
            raise RunnerError(
                f"images: {Path(argv[0]).name} failed with exit code {process.returncode}"
            )
        return logged
