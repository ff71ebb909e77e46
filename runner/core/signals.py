"""SIGTERM as a process of the lab's controller receives it. A CI runner, or a shell's `nohup`
and job control, may start a process with SIGTERM ignored or blocked, and both survive exec:
every long-lived process of ours sets its own disposition, so `kill PID` always stops it."""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

Handler = Callable[[int, FrameType | None], object] | int


def take_sigterm(handler: Handler = signal.SIG_DFL) -> None:
    """SIGTERM unblocked and handled by ``handler`` (default: the process ends)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, handler)
