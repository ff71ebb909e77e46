"""A fleet run's Temporal histories, kept in its run directory where the credential scan reads
them: every message the controller, the workflows and the hosts exchanged, as the server
stored it.

Temporal stores each payload base64-encoded. The credential scan decodes base64 runs itself,
but a reader does not: the kept history has every payload decoded (its ``metadata`` and
``data``: the JSON the pydantic converter wrote, as JSON), and that is the form scanned; it is
evidence to read, no longer a history the server or a replayer would take back.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from temporalio.client import Client

from runner.core.files import write_atomic
from runner.records.paths import RunPaths


def _text(encoded: str) -> str:
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8", "backslashreplace")
    except (binascii.Error, ValueError):
        return encoded


def decoded(node: Any) -> Any:
    """The history's JSON with each payload (``{"metadata": ..., "data": ...}``) decoded."""
    if isinstance(node, list):
        return [decoded(item) for item in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("metadata"), dict) and isinstance(node.get("data", ""), str):
        metadata = {name: _text(value) for name, value in node["metadata"].items()}
        data = _text(node.get("data", ""))
        if metadata.get("encoding") == "json/plain":
            try:
                return {"metadata": metadata, "data": json.loads(data)}
            except ValueError:
                pass
        return {"metadata": metadata, "data": data}
    return {name: decoded(value) for name, value in node.items()}


async def keep_histories(client: Client, paths: RunPaths, workflow_ids: list[str]) -> None:
    """Each workflow's history, its payloads decoded, into the run directory."""
    for workflow_id in workflow_ids:
        try:
            history = await client.get_workflow_handle(workflow_id).fetch_history()
        except Exception:  # never started (the run stopped before it)
            continue
        readable = decoded(json.loads(history.to_json()))
        write_atomic(paths.fleet_history(workflow_id), json.dumps(readable, indent=1).encode())
