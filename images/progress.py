"""What of mmdebstrap's --verbose output reaches the console (all of it is in build.log).

Lines starting "I: ", "W: " or "E: " are shown as they come: mmdebstrap's steps ("I: installing
remaining packages inside the chroot...") and the few package scripts that write the same way.
From "I: installing ... packages" on, dpkg works through the packages apt planned, for minutes
under emulation; its "Unpacking"/"Setting up" lines become one count line every few seconds
(``packages: 98/145 unpacked, 57/145 set up``) and a last one when all are set up, so a slow
build can be told from a hung one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

_SHOWN = re.compile(r"^[IWE]: ")
_PHASE_START = re.compile(r"^I: installing \w+ packages")
# apt's plan, printed before each phase: "0 upgraded, 145 newly installed, 0 to remove ...".
_PLAN = re.compile(r"^(\d+) upgraded, (\d+) newly installed")
_UNPACKING = re.compile(r"^Unpacking \S+ \(")
_SETTING_UP = re.compile(r"^Setting up \S+ \(")

PROGRESS_INTERVAL_SECONDS = 5.0


class PackageProgress:
    """Feed it every output line of mmdebstrap; it returns the lines to show on the console."""

    def __init__(
        self,
        interval: float = PROGRESS_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._planned = 0
        self._in_phase = False
        self._unpacked = 0
        self._set_up = 0
        self._last_shown = 0.0

    def console_lines(self, line: str) -> list[str]:
        if plan := _PLAN.match(line):
            self._planned = int(plan[1]) + int(plan[2])
        elif _SHOWN.match(line):
            if _PHASE_START.match(line):
                self._in_phase = True
                self._unpacked = self._set_up = 0
                self._last_shown = self._clock()
            return [line]
        elif self._in_phase and _UNPACKING.match(line):
            self._unpacked += 1
            return self._count()
        elif self._in_phase and _SETTING_UP.match(line):
            self._set_up += 1
            self._in_phase = self._set_up < self._planned
            return self._count()
        return []

    def _count(self) -> list[str]:
        """The count line, if the interval has passed since the last or the phase is done."""
        now = self._clock()
        if self._in_phase and now - self._last_shown < self._interval:
            return []
        self._last_shown = now
        total = self._planned
        return [f"packages: {self._unpacked}/{total} unpacked, {self._set_up}/{total} set up"]
