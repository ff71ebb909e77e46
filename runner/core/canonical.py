"""Canonical JSON and content digests: every hash in the tool is taken over these bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def canonical_json(data: BaseModel | Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the same content gives the same bytes."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json", by_alias=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_digest(data: bytes) -> str:
    """A digest written the way every file of the tool writes one: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(path: str | bytes | Any) -> str:
    with open(path, "rb") as handle:
        return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
