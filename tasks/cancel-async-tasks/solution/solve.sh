#!/bin/bash
# Reference solution: a semaphore bounds the running tasks. asyncio.run turns SIGINT into
# cancelling the main task; gather then cancels every task (the queued ones never acquire the
# semaphore), and the started ones are awaited until their cleanup is done.
set -euo pipefail
cat > /app/run.py <<'PY'
import asyncio
from collections.abc import Awaitable, Callable


async def run_tasks(tasks: list[Callable[[], Awaitable[None]]], max_concurrent: int) -> None:
    semaphore = asyncio.Semaphore(max_concurrent)

    async def run_one(task: Callable[[], Awaitable[None]]) -> None:
        async with semaphore:
            await task()

    running = [asyncio.ensure_future(run_one(task)) for task in tasks]
    try:
        await asyncio.gather(*running)
    except asyncio.CancelledError:
        # gather has cancelled every task, but it returns as soon as the first one (a queued
        # one) is done: wait until the started ones have finished their cleanup as well.
        await asyncio.gather(*running, return_exceptions=True)
        raise
PY
cd /app && python3 -c "from run import run_tasks; print(run_tasks.__name__)"
