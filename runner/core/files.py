"""Writing and reading model files: atomic replace on write, validation on read."""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from runner.core.canonical import canonical_json
from runner.core.errors import InputError, describe_validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file beside the target, fsync, ``os.replace``: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_model(path: Path, model: BaseModel) -> None:
    write_atomic(path, canonical_json(model) + b"\n")


def read_model(path: Path, model_type: type[ModelT]) -> ModelT:
    try:
        return model_type.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except ValidationError as error:
        raise InputError(describe_validation_error(path, error)) from None


def read_toml_model(path: Path, model_type: type[ModelT], kind: str) -> ModelT:
    """Read and validate a TOML file of ``kind`` (a lock, a fleet file); every problem becomes
    one ``InputError`` line."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such {kind} file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid TOML: {error}") from None
    try:
        return model_type.model_validate(data)
    except ValidationError as error:
        raise InputError(describe_validation_error(path, error)) from None
