"""Named phases of a piece of work and the seconds each took (a cell's, a freeze's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class PhaseTimer:
    seconds: dict[str, float] = field(default_factory=dict)
    current: str | None = None  # the phase running now; kept when it raised
    # Told each phase's name as it starts (a fleet host heartbeats it, runner.fleet.host).
    listener: Callable[[str], None] | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        self.current = name
        if self.listener is not None:
            self.listener(name)
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - started, 3)
        self.current = None
