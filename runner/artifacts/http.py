"""HTTP for the registries: one session, retries for what a flaky registry or proxy does."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from runner.core.errors import RunnerError

_ATTEMPTS = 4
_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_read=60)


def new_session() -> aiohttp.ClientSession:
    # trust_env: the host's proxy settings (if any) and CA bundle apply, as for apt, npm and pip.
    return aiohttp.ClientSession(timeout=_TIMEOUT, trust_env=True, raise_for_status=True)


def is_transient(error: BaseException) -> bool:
    """A dropped connection, a time-out or a server error is retried; a 4xx answer is final."""
    if isinstance(error, aiohttp.ClientResponseError):
        return error.status >= 500 or error.status == 429
    return isinstance(error, aiohttp.ClientError | asyncio.TimeoutError)


def retrying() -> AsyncRetrying:
    return AsyncRetrying(
        stop=stop_after_attempt(_ATTEMPTS),
        wait=wait_exponential(multiplier=1, max=10),
        retry=retry_if_exception(is_transient),
        reraise=True,
    )


async def get_json(session: aiohttp.ClientSession, url: str, accept: str) -> Any | None:
    """The JSON document at ``url``, or None when the server says it has none (404)."""
    try:
        async for attempt in retrying():
            with attempt:
                async with session.get(url, headers={"Accept": accept}) as response:
                    return await response.json(content_type=None)
    except aiohttp.ClientResponseError as error:
        if error.status == 404:
            return None
        raise RunnerError(f"{url}: the registry answered {error.status} {error.message}") from None
    except (aiohttp.ClientError, TimeoutError) as error:
        raise RunnerError(f"{url}: no answer from the registry: {error or 'timed out'}") from None
    raise AssertionError("unreachable: tenacity re-raises the last error")
