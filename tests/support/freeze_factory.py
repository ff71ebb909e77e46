"""Freeze manifests for tests, built the way ``runner freeze`` builds them."""

from __future__ import annotations

from typing import Any

from runner.freeze.manifest import Collected, FreezeManifest, FreezeScope, GuestState

LOCK_FINGERPRINT = "sha256:" + "0" * 64


def manifest_of(
    scope: dict[str, Any], collected: dict[str, Any], lab: str = "test"
) -> FreezeManifest:
    frozen_scope = FreezeScope.model_validate(scope)
    state = GuestState.of(Collected.model_validate(collected), frozen_scope)
    return FreezeManifest(
        lab=lab, environment_fingerprint=LOCK_FINGERPRINT, scope=frozen_scope, state=state
    )
