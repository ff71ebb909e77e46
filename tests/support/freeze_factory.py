"""Freeze manifests for tests, built the way ``runner freeze`` builds them."""

from __future__ import annotations

from typing import Any

from runner.freeze.inventory import Observed, inventory_of
from runner.freeze.manifest import Collected, FreezeManifest, FreezeScope, GuestState

LOCK_FINGERPRINT = "sha256:" + "0" * 64
SCOPE: dict[str, Any] = {"disk_excludes": ["/var/log"]}


def manifest_of(
    scope: dict[str, Any],
    collected: dict[str, Any],
    lab: str = "test",
    live: dict[str, dict[str, str]] | None = None,
    entries: dict[str, str] | None = None,
) -> FreezeManifest:
    """The manifest of a guest that reported ``collected`` and ``live``, whose disk held
    ``entries`` (path -> inventory entry)."""
    frozen_scope = FreezeScope.model_validate({**SCOPE, **scope})
    observed = Observed(entries=dict(entries or {}))
    inventory = inventory_of(observed, frozen_scope.disk_excludes)
    state = GuestState.of(
        Collected.model_validate(collected), live or {}, inventory, observed, frozen_scope
    )
    return FreezeManifest(
        lab=lab, environment_fingerprint=LOCK_FINGERPRINT, scope=frozen_scope, state=state
    )
