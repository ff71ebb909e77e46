"""The base of every file model, and the field types more than one file format shares."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"

# A content digest as every file of the tool writes one: ``sha256:<64 hex>`` (core.canonical).
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]
# A name that is safe as a path component and a libvirt/Podman name.
Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=64)]


class FrozenModel(BaseModel):
    """Base for every file model: unknown fields are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class OmitDefaults(FrozenModel):
    """A file model whose fields listed in ``omitted_at_default`` are left out of a dump while
    they hold their default: a field added later then leaves older files' digests unchanged."""

    omitted_at_default: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self.omitted_at_default:
            if name in data and getattr(self, name) == type(self).model_fields[name].get_default(
                call_default_factory=True
            ):
                del data[name]
        return data
