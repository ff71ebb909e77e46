"""Renders a report page in Debian's headless Chromium (scripts/setup-host.sh installs
chromium-headless-shell): a screenshot, the DOM after rendering, and what Chromium logged."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path

from runner.core.roots import REPO_ROOT

CI_ARTIFACTS = REPO_ROOT / ".cache" / "ci-artifacts"
TIMEOUT = 60  # seconds per Chromium call
WINDOW = "1280,4000"
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr")
_REQUESTED = re.compile(r"FileURLLoader::Start: (file://\S+)")


def chromium() -> str | None:
    """The headless Chromium on PATH, if any."""
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


@dataclass
class Page(HTMLParser):
    """Tables (rows of cell texts), link targets, image sources and element ids of a page."""

    tables: list[list[list[str]]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    _cell: list[str] | None = None

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a" and found.get("href"):
            self.links.append(str(found["href"]))
        elif tag == "img":
            self.images.append(str(found.get("src")))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


@dataclass(frozen=True)
class RenderedPage:
    html_path: Path
    screenshot: Path
    dom: str  # the DOM after rendering (--dump-dom)
    log: str  # Chromium's stderr of both calls

    @cached_property
    def page(self) -> Page:
        return parse(self.dom)

    @property
    def console_errors(self) -> list[str]:
        """Console messages (the page has no script: any is unexpected) and failed loads."""
        return [
            line
            for line in self.log.splitlines()
            if ":CONSOLE" in line or "Failed to load resource" in line
        ]

    @property
    def requested(self) -> set[Path]:
        """The files Chromium read for the page (its verbose log names each)."""
        return {Path(url.removeprefix("file://")) for url in _REQUESTED.findall(self.log)}

    def colours(self) -> dict[tuple[int, int, int], int]:
        """Pixel count per RGB colour of the screenshot."""
        from PIL import Image

        with Image.open(self.screenshot) as image:
            found = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
        return {colour: count for count, colour in found}


def _chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [binary, *_FLAGS, *args], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def render(html_path: Path, screenshot_path: Path) -> RenderedPage:
    """Screenshot of ``html_path`` at 1280x4000, and its rendered DOM with Chromium's log."""
    binary = chromium()
    assert binary, "no headless Chromium: scripts/setup-host.sh installs chromium-headless-shell"
    url = html_path.resolve().as_uri()
    screenshot_path.parent.mkdir(parents=True, exist_ok=True)
    shot = _chromium(
        binary, "--v=0", f"--screenshot={screenshot_path}", f"--window-size={WINDOW}", url
    )
    dumped = _chromium(binary, "--v=1", "--dump-dom", url)
    return RenderedPage(html_path, screenshot_path, dumped.stdout, shot.stderr + dumped.stderr)
