"""The credential boundary: per-cell bearers in, the real key out, every POST counted."""

from runner.proxy.models import ProxyCellCounts, RequestLogEntry, TokenUsage
from runner.proxy.server import CredentialProxy

__all__ = ["CredentialProxy", "ProxyCellCounts", "RequestLogEntry", "TokenUsage"]
