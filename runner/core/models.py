"""The base of every file model, and the field types more than one file format shares."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from runner.core.errors import RunnerError, describe_validation_error

SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"

# A content digest as every file of the tool writes one: ``sha256:<64 hex>`` (core.canonical).
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]
# A name that is safe as a path component and a libvirt/Podman name.
Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=64)]
# Beneath a cell's outcome, who or what ended it (runner.cells.failure_class derives it; the
# ledger records it; a lock's retry policy names the classes it re-runs).
FailureClass = Literal[
    "success",
    "verifier_failure",
    "model_failure",
    "harness_failure",
    "setup_failure",
    "verifier_setup",
    "unjudged_task",
    "timeout",
    "cancelled",
    "unknown",
]


class FrozenModel(BaseModel):
    """Base for every file model: unknown fields are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Fields added to a file format after files of it were written (and fingerprints of them
    # published): at their default they are left out of the model's JSON, so a file that does
    # not use them keeps its bytes, its canonical JSON and so its fingerprint.
    LATE_FIELDS: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_late_fields_at_default(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        data = handler(self)
        for name in self.LATE_FIELDS:
            field = type(self).model_fields[name]
            if getattr(self, name) == field.get_default(call_default_factory=True):
                data.pop(field.alias if info.by_alias and field.alias else name, None)
        return data


ModelT = TypeVar("ModelT", bound=BaseModel)


def updated(model: ModelT, /, **changes: Any) -> ModelT:
    """``model`` with ``changes`` (by field name), validated as a new instance would be: pydantic's
    ``model_copy(update=...)`` checks nothing, so a misspelled status or a negative count would
    be written and fail only when read back. Only the fields ``model`` was given are passed again
    (the others are at their defaults), so the copy's ``model_fields_set`` is the original's plus
    ``changes`` and its JSON, canonical JSON and fingerprint are what ``model_copy`` gave; nested
    models are kept as they are (pydantic does not validate an instance again); private
    attributes are carried over as ``model_copy`` carries them."""
    given = {name: getattr(model, name) for name in model.model_fields_set}
    try:
        copy = type(model).model_validate({**given, **changes}, by_alias=False, by_name=True)
    except ValidationError as error:
        raise RunnerError(
            describe_validation_error(f"{type(model).__name__} update", error)
        ) from error
    if model.__pydantic_private__:
        object.__setattr__(copy, "__pydantic_private__", dict(model.__pydantic_private__))
    return copy
