"""Loopback load test of the credential proxy: what it adds to each request, and how many it passes.

Three processes, all on 127.0.0.1: the scripted provider (``python -m runner.provider``), the
proxy (in this process, as the executor runs it), and the load client (this script again, with
``--client``), so no two of them share an interpreter lock.

1. Latency: ``--latency-requests`` sequential requests, alternating direct-to-provider and
   through-proxy; the proxy's added latency is the difference of the percentiles.
2. Throughput: ``--requests`` requests through the proxy with ``--concurrency`` in flight, then
   the same straight to the provider for reference.
Each phase stops at ``--time-cap`` seconds whatever it has done. Targets: added p99 < 1 ms,
>= 2,000 requests per second. The numbers printed are what was measured on this machine.

    python bench/proxy_load.py [--requests 20000] [--concurrency 32] [--time-cap 120]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from runner.lock import Model
from runner.paths import RunPaths
from runner.provider import ProviderScript
from runner.proxy import CredentialProxy

KEY_ENV = "PROXY_LOAD_PROVIDER_KEY"
BODY = {"model": "bench", "messages": [{"role": "user", "content": "ping"}]}
SCRIPT = ProviderScript(name="bench", turns=(), final_text="pong")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _one(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=BODY, headers=headers) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return (time.perf_counter() - started) * 1000


async def client_latency(targets: list[dict[str, Any]], count: int, cap: float) -> dict[str, Any]:
    samples: dict[str, list[float]] = {target["name"]: [] for target in targets}
    deadline = time.monotonic() + cap
    async with aiohttp.ClientSession() as session:
        for target in targets:  # warm up connections and code paths
            for _ in range(50):
                await _one(session, target["url"], target["headers"])
        for n in range(count):
            if time.monotonic() > deadline:
                break
            target = targets[n % len(targets)]
            samples[target["name"]].append(await _one(session, target["url"], target["headers"]))
    return {
        name: {
            "n": len(values),
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
            "mean_ms": statistics.fmean(values),
        }
        for name, values in samples.items()
    }


async def client_throughput(
    target: dict[str, Any], count: int, concurrency: int, cap: float
) -> dict[str, Any]:
    done = 0
    deadline = time.monotonic() + cap
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal done
            while done < count and time.monotonic() < deadline:
                done += 1
                await _one(session, target["url"], target["headers"])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "name": target["name"],
        "requests": done,
        "seconds": elapsed,
        "rps": done / elapsed,
        "capped": done < count,
    }


def run_client(args: argparse.Namespace) -> None:
    job = json.loads(args.client)
    if job["phase"] == "latency":
        result = asyncio.run(client_latency(job["targets"], job["count"], job["cap"]))
    else:
        result = asyncio.run(
            client_throughput(job["target"], job["count"], job["concurrency"], job["cap"])
        )
    print(json.dumps(result))


def client(job: dict[str, Any]) -> Any:
    command = [sys.executable, __file__, "--client", json.dumps(job)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--latency-requests", type=int, default=4_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--time-cap", type=float, default=120.0)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args)
        return

    key = secrets.token_urlsafe(32)
    os.environ[KEY_ENV] = key
    with tempfile.TemporaryDirectory() as scratch:
        script_path = Path(scratch, "script.json")
        script_path.write_text(SCRIPT.model_dump_json())
        provider = subprocess.Popen(
            [sys.executable, "-m", "runner.provider", str(script_path), "--key-env", KEY_ENV],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert provider.stdout is not None
            provider_url = provider.stdout.readline().strip()
            model = Model(
                id="bench",
                provider="bench",
                model="bench",
                thinking="off",
                api="openai-completions",
                base_url=provider_url,
                key_env=KEY_ENV,
            )
            with CredentialProxy(RunPaths(Path(scratch, "run"))) as proxy:
                bearer = proxy.open_cell("bench", model, datetime.now(UTC) + timedelta(hours=1))
                direct = {
                    "name": "direct",
                    "url": provider_url + "/chat/completions",
                    "headers": {"Authorization": f"Bearer {key}"},
                }
                proxied = {
                    "name": "proxy",
                    "url": proxy.base_url + "/chat/completions",
                    "headers": {"Authorization": f"Bearer {bearer}"},
                }
                latency = client(
                    {
                        "phase": "latency",
                        "targets": [direct, proxied],
                        "count": args.latency_requests,
                        "cap": args.time_cap,
                    }
                )
                through = client(
                    {
                        "phase": "throughput",
                        "target": proxied,
                        "count": args.requests,
                        "concurrency": args.concurrency,
                        "cap": args.time_cap,
                    }
                )
                counts = proxy.close_cell("bench")
            reference = client(
                {
                    "phase": "throughput",
                    "target": direct,
                    "count": args.requests,
                    "concurrency": args.concurrency,
                    "cap": args.time_cap,
                }
            )
        finally:
            provider.terminate()
            provider.wait()

    added_p50 = latency["proxy"]["p50_ms"] - latency["direct"]["p50_ms"]
    added_p99 = latency["proxy"]["p99_ms"] - latency["direct"]["p99_ms"]
    summary = {
        "latency": latency,
        "added_latency_ms": {"p50": added_p50, "p99": added_p99},
        "throughput_proxy": through,
        "throughput_direct": reference,
        "proxy_counted_posts": counts.physical_posts,
        "targets_met": {
            "added_p99_below_1ms": added_p99 < 1.0,
            "at_least_2000_rps": through["rps"] >= 2000,
        },
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
