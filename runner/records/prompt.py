"""What a harness offered the model in a cell's first request: the evidence that its extensions
loaded (their tools are there) and its fixed prompt overhead, read by the proxy off the body."""

from __future__ import annotations

from pydantic import Field

from runner.core.models import FrozenModel


class PromptFootprint(FrozenModel):
    """The first provider request of a cell: tool names in the order offered, and the UTF-8 byte
    sizes of its system prompt (all system/developer text) and of its tool definitions (the
    ``tools`` array as compact JSON)."""

    api_path: str
    tool_names: tuple[str, ...] = ()
    system_prompt_bytes: int = Field(ge=0)
    tool_definitions_bytes: int = Field(ge=0)

    @property
    def overhead_bytes(self) -> int:
        return self.system_prompt_bytes + self.tool_definitions_bytes
