"""The Temporal client every fleet process uses: the fleet file's server and namespace, the
pydantic data converter (every message is a FrozenModel, runner.fleet.messages)."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from runner.core.errors import RunnerError
from runner.spec.fleet import Fleet


async def connect(fleet: Fleet) -> Client:
    try:
        return await Client.connect(
            fleet.temporal, namespace=fleet.namespace, data_converter=pydantic_data_converter
        )
    except RuntimeError as error:  # the SDK's core says "Failed client connect: ..."
        raise RunnerError(
            f"Temporal server {fleet.temporal} (namespace {fleet.namespace}): {error}"
        ) from None
