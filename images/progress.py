"""What of mmdebstrap's --verbose output reaches the console (all of it is in build.log).

Lines starting "I: ", "W: " or "E: " are shown as they come: mmdebstrap's steps ("I: installing
remaining packages inside the chroot...") and the few package scripts that write the same way.
From "I: installing ... packages" on, dpkg works through the packages apt planned, for minutes
under emulation; its "Unpacking"/"Setting up" lines become a count line at most every few
seconds, also while a package script runs silently, and at once when all are set up:

    packages: 145/145 unpacked, 98/145 set up; setting up ca-certificates

so a slow build can be told from a hung one. The phase lasts until mmdebstrap's next own line
after the last package is set up (the triggers run in between).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

_SHOWN = re.compile(r"^[IWE]: ")
_PHASE_START = re.compile(r"^I: installing \w+ packages")
# apt's plan, printed before each phase: "0 upgraded, 145 newly installed, 0 to remove ...".
_PLAN = re.compile(r"^(\d+) upgraded, (\d+) newly installed")
_DPKG_STEP = re.compile(r"^(Unpacking|Setting up|Processing triggers for) (\S+) \(")

PROGRESS_INTERVAL_SECONDS = 5.0


class PackageProgress:
    """Give ``console_lines`` every line mmdebstrap prints, and None for each second of silence
    (BuildLog.run's ``show``); it returns the lines to show on the console."""

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
        self._doing = ""
        self._last_shown = 0.0

    def console_lines(self, line: str | None) -> list[str]:
        if line is None:
            return self._silence()
        if plan := _PLAN.match(line):
            self._planned = int(plan[1]) + int(plan[2])
        elif _SHOWN.match(line):
            self._shown_line(line)
            return [line]
        elif self._in_phase and (step := _DPKG_STEP.match(line)):
            return self._dpkg_step(step[1], step[2])
        return []

    def _silence(self) -> list[str]:
        # Not before dpkg's first line: apt may not have printed this phase's plan yet.
        return self._count(at_once=False) if self._in_phase and self._doing else []

    def _shown_line(self, line: str) -> None:
        if _PHASE_START.match(line):
            self._in_phase = True
            self._unpacked = self._set_up = 0
            self._doing = ""
            self._last_shown = self._clock()
        elif self._set_up >= self._planned:
            self._in_phase = False

    def _dpkg_step(self, step: str, package: str) -> list[str]:
        self._doing = f"{step.lower()} {package}"
        if step == "Unpacking":
            self._unpacked += 1
        elif step == "Setting up":
            self._set_up += 1
            return self._count(at_once=self._set_up == self._planned)
        return self._count(at_once=False)

    def _count(self, *, at_once: bool) -> list[str]:
        """The count line, if asked for at once or the interval has passed since the last."""
        now = self._clock()
        if not at_once and now - self._last_shown < self._interval:
            return []
        self._last_shown = now
        total = self._planned
        return [
            f"packages: {self._unpacked}/{total} unpacked, {self._set_up}/{total} set up;"
            f" {self._doing}"
        ]
