"""The credential boundary: per-cell bearers in, the real key out, every POST counted.

The server (aiohttp, uvloop) is imported on first use, so the light modules of this package
(``models``) also import where only pydantic is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.proxy.models import ProxyCellCounts, RequestLogEntry, TokenUsage

if TYPE_CHECKING:
    from runner.proxy.server import CredentialProxy

__all__ = ["CredentialProxy", "ProxyCellCounts", "RequestLogEntry", "TokenUsage"]


def __getattr__(name: str) -> Any:
    if name == "CredentialProxy":
        from runner.proxy.server import CredentialProxy

        return CredentialProxy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
