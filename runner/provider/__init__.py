"""The offline scripted provider: a stand-in model endpoint for the demo lock and the tests."""

from runner.provider.script import (
    PROVIDER_MARKER,
    Fault,
    ProviderScript,
    ToolCall,
    Turn,
    script_for,
)
from runner.provider.server import ScriptedProvider

__all__ = [
    "PROVIDER_MARKER",
    "Fault",
    "ProviderScript",
    "ScriptedProvider",
    "ToolCall",
    "Turn",
    "script_for",
]
