"""A fleet run's Temporal history is kept with its payloads decoded: the server stores each
payload base64-encoded, which the credential scan searches too but a reader cannot read."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from runner.core.files import write_atomic
from runner.fleet.history import decoded
from runner.proxy.bearer import new_bearer
from runner.records.paths import RunPaths
from runner.scan.scan import scan_run


def payload(value: object) -> dict[str, object]:
    return {
        "metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
        "data": base64.b64encode(json.dumps(value).encode()).decode(),
    }


def history_with(value: object) -> dict[str, object]:
    event = {"eventId": "5", "activityTaskCompletedEventAttributes": {"result": {}}}
    event["activityTaskCompletedEventAttributes"]["result"] = {"payloads": [payload(value)]}  # type: ignore[index]
    return {"events": [event]}


def test_a_payload_is_decoded_to_its_json():
    history = decoded(history_with({"cell_id": "c1", "phase": "agent"}))
    (kept,) = history["events"][0]["activityTaskCompletedEventAttributes"]["result"]["payloads"]
    assert kept == {
        "metadata": {"encoding": "json/plain"},
        "data": {"cell_id": "c1", "phase": "agent"},
    }


def test_a_bearer_in_a_payload_is_a_leak_in_base64_and_decoded(tmp_path: Path):
    bearer = new_bearer()
    raw = history_with({"reason": f"harbor said {bearer}"})
    paths = RunPaths(tmp_path / "run")
    secrets = {"provider_key": ("k" * 32,)}
    for history in (raw, decoded(raw)):  # the scan decodes base64 runs itself
        write_atomic(paths.fleet_history("raw"), json.dumps(history).encode())
        report = scan_run(paths, secrets)
        assert [(leak.file, leak.kind) for leak in report.leaks] == [
            ("fleet/history/raw.json", "bearer")
        ]
