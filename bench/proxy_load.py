"""Loopback load test of the credential proxy: what it adds to each request, and how many it passes.

Processes, all on 127.0.0.1: the scripted provider (``python -m runner.provider``), the proxy
(in this process, on its own thread, as the executor runs it) and ``--clients`` load clients
(this script again, ``--worker``). The clients speak just enough HTTP/1.1 over raw keep-alive
connections to cost a fraction of what the servers they load cost per request (an aiohttp
client, such as the proxy's own upstream leg, costs several times more), so on two cores they
do not cap the rate they measure; the output shows each process's CPU per request.

Both paths, direct to the provider and through the proxy, are measured in the same run:
1. warm-up: every connection sends WARMUP_REQUESTS before anything is timed;
2. latency: one connection per path, one request at a time, alternating direct and proxied, up
   to --latency-requests or --latency-seconds; added latency = difference of the percentiles;
3. throughput: --clients processes x --concurrency connections each, --rounds rounds of
   --round-seconds per path, the paths alternating so a change in the box's load hits both.
The whole plan is capped at 30 s, and every client job ends JOB_GRACE seconds after its plan
at the latest. Printed beside the numbers: the load average and the CPU that other work took
meanwhile (the 2-core lab host is shared with a QEMU TCG guest), and the CPU each of our
processes spent per request, which shifts less with that sharing than the rate. Targets: added
latency p99 < 1 ms, >= 2,000 requests/s through the proxy (the mean of its rounds).

    python bench/proxy_load.py [--clients 2] [--concurrency 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import uvloop

from runner.provider import ProviderScript
from runner.proxy import CredentialProxy
from runner.records.paths import RunPaths
from runner.spec.lock import Model

KEY_ENV = "PROXY_LOAD_PROVIDER_KEY"
BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "ping"}]})
SCRIPT = ProviderScript(name="bench", turns=(), final_text="pong")
WARMUP_REQUESTS = 200  # per connection: connections opened, code paths and caches warm
START_DELAY = 0.5  # s: a throughput round starts this long after it is sent to the clients
JOB_GRACE = 10.0  # s: a client job still running this long after its plan has hung
MAX_PLAN_SECONDS = 30.0
STARTUP_ALLOWANCE = 4.0  # s: interpreters, provider and proxy start, warm-up
TARGET_ADDED_P99_MS = 1.0
TARGET_RPS = 2000.0
TICKS = os.sysconf("SC_CLK_TCK")


# -- load client (worker process) ------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time; answers carry Content-Length."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._answer: asyncio.Future[int] | None = None

    @classmethod
    async def open(cls, port: int) -> _Connection:
        _, connection = await asyncio.get_running_loop().create_connection(cls, "127.0.0.1", port)
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        head_end = self._buffer.find(b"\r\n\r\n")
        answer = self._answer
        if head_end < 0 or answer is None:
            return
        head = bytes(self._buffer[:head_end]).lower().split(b"\r\n")
        lengths = [
            value
            for name, _, value in (line.partition(b":") for line in head[1:])
            if name == b"content-length"
        ]
        if not lengths:
            self._answer = None
            answer.set_exception(RuntimeError("answer without Content-Length"))
            return
        size = head_end + 4 + int(lengths[0])
        if len(self._buffer) >= size:
            del self._buffer[:size]
            self._answer = None
            answer.set_result(int(head[0][9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._answer is not None:
            self._answer.set_exception(ConnectionError("connection closed mid-answer"))

    async def post(self, request: bytes) -> None:
        assert self._transport is not None
        answer = self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        status = await answer
        if status != 200:
            raise RuntimeError(f"HTTP {status}")


async def _warm(connection: _Connection, request: bytes) -> None:
    for _ in range(WARMUP_REQUESTS):
        await connection.post(request)


async def _latency(job: dict[str, Any]) -> dict[str, Any]:
    targets = job["targets"]
    connections = [await _Connection.open(target["port"]) for target in targets]
    requests = [target["request"].encode() for target in targets]
    for connection, request in zip(connections, requests, strict=True):
        await _warm(connection, request)
    samples: list[list[float]] = [[] for _ in targets]
    deadline = time.monotonic() + job["seconds"]
    for n in range(job["count"]):
        if time.monotonic() > deadline:
            break
        which = n % len(targets)
        started = time.perf_counter()
        await connections[which].post(requests[which])
        samples[which].append((time.perf_counter() - started) * 1000)
    return {
        "sent": [WARMUP_REQUESTS + len(values) for values in samples],
        "samples": samples,
    }


async def _throughput(job: dict[str, Any]) -> dict[str, Any]:
    request = job["target"]["request"].encode()
    connections = [await _Connection.open(job["target"]["port"]) for _ in range(job["concurrency"])]
    await asyncio.gather(*(_warm(connection, request) for connection in connections))
    await asyncio.sleep(max(0.0, job["start_at"] - time.time()))
    cpu_started = time.process_time()
    end = time.monotonic() + job["seconds"]
    answered = sent = 0

    async def drive(connection: _Connection) -> None:
        nonlocal answered, sent
        while time.monotonic() < end:
            sent += 1
            await connection.post(request)
            if time.monotonic() <= end:  # the answers that came in the window count
                answered += 1

    await asyncio.gather(*(drive(connection) for connection in connections))
    return {
        "answered": answered,
        "sent": WARMUP_REQUESTS * len(connections) + sent,
        "cpu_seconds": time.process_time() - cpu_started,
    }


def worker() -> None:
    """Serve jobs: one JSON line in on stdin, one JSON line out, until stdin closes."""
    for line in sys.stdin:
        job = json.loads(line)
        phase = _latency if job["phase"] == "latency" else _throughput
        try:
            result = uvloop.run(asyncio.wait_for(phase(job), job["seconds"] + JOB_GRACE))
        except (OSError, RuntimeError) as error:  # TimeoutError is an OSError
            result = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(result), flush=True)


# -- coordinator -----------------------------------------------------------------------------


def raw_post(port: int, credential: str) -> str:
    return (
        f"POST /chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {credential}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n{BODY}"
    )


class Clients:
    """The load client processes: ``send`` hands each a job, ``answers`` waits for the results."""

    def __init__(self, count: int) -> None:
        command = [sys.executable, __file__, "--worker"]
        self._processes = [
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(count)
        ]

    def send(self, jobs: list[dict[str, Any]]) -> None:
        for process, job in zip(self._processes, jobs, strict=False):
            assert process.stdin is not None
            process.stdin.write(json.dumps(job) + "\n")
            process.stdin.flush()

    def answers(self, count: int) -> list[dict[str, Any]]:
        results = []
        for process in self._processes[:count]:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("a load client died")
            result: dict[str, Any] = json.loads(line)
            if "error" in result:
                raise RuntimeError(f"load client: {result['error']}")
            results.append(result)
        return results

    def close(self) -> None:
        for process in self._processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in self._processes:
            try:
                process.wait(timeout=JOB_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Window:
    """CPU seconds spent while a throughput round ran: this process's (the proxy), the
    provider's, and the whole box's."""

    proxy: float
    provider: float
    box_busy: float


def _box_busy_cpu() -> float:
    """CPU seconds the whole box has been busy since boot, from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / TICKS


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_round(start_at: float, seconds: float, provider_pid: int) -> Window:
    time.sleep(max(0.0, start_at - time.time()))
    before = (_own_cpu(), _process_cpu(provider_pid), _box_busy_cpu())
    time.sleep(seconds)
    after = (_own_cpu(), _process_cpu(provider_pid), _box_busy_cpu())
    return Window(*(a - b for a, b in zip(after, before, strict=True)))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def latency_summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": percentile(values, 0.5),
        "p99_ms": percentile(values, 0.99),
        "mean_ms": statistics.fmean(values),
    }


def throughput_round(
    clients: Clients, args: argparse.Namespace, target: dict[str, Any], provider_pid: int
) -> dict[str, Any]:
    start_at = time.time() + START_DELAY
    job = {
        "phase": "throughput",
        "target": target,
        "concurrency": args.concurrency,
        "start_at": start_at,
        "seconds": args.round_seconds,
    }
    clients.send([job] * args.clients)
    window = measure_round(start_at, args.round_seconds, provider_pid)
    answers = clients.answers(args.clients)
    answered = sum(answer["answered"] for answer in answers)
    if not answered:
        raise RuntimeError(f"no answer at all from the {target['name']} path in a round")
    client_cpu = sum(answer["cpu_seconds"] for answer in answers)
    ours = client_cpu + window.provider + (window.proxy if target["name"] == "proxy" else 0.0)
    return {
        "path": target["name"],
        "rps": answered / args.round_seconds,
        "sent": sum(answer["sent"] for answer in answers),
        "cpu_us_per_request": {
            "clients": 1e6 * client_cpu / answered,
            "provider": 1e6 * window.provider / answered,
            "proxy": 1e6 * window.proxy / answered if target["name"] == "proxy" else None,
        },
        "other_work_cores": max(0.0, window.box_busy - ours) / args.round_seconds,
        "load_average": os.getloadavg(),
    }


@contextmanager
def scripted_provider(scratch: str) -> Iterator[tuple[str, int]]:
    """The provider in its own process (its CPU is not the proxy's): (base URL, pid)."""
    script_path = Path(scratch, "script.json")
    script_path.write_text(SCRIPT.model_dump_json())
    provider = subprocess.Popen(
        [sys.executable, "-m", "runner.provider", str(script_path), "--key-env", KEY_ENV],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert provider.stdout is not None
        base_url = provider.stdout.readline().strip()
        if not base_url:
            raise RuntimeError("the scripted provider did not start")
        yield base_url, provider.pid
    finally:
        provider.terminate()
        provider.wait()


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    key = secrets.token_urlsafe(32)
    os.environ[KEY_ENV] = key  # read by the provider and by the proxy (the model's key_env)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        provider_url, provider_pid = stack.enter_context(scripted_provider(scratch))
        model = Model(
            id="bench",
            provider="bench",
            model="bench",
            thinking="off",
            api="openai-completions",
            base_url=provider_url,
            key_env=KEY_ENV,
        )
        proxy = stack.enter_context(CredentialProxy(RunPaths(Path(scratch, "run"))))
        clients = Clients(args.clients)
        stack.callback(clients.close)
        bearer = proxy.open_cell("bench", model, datetime.now(UTC) + timedelta(hours=1))
        provider_port = int(provider_url.rpartition(":")[2])
        proxy_port = int(proxy.base_url.rpartition(":")[2])
        direct = {"name": "direct", "port": provider_port, "request": raw_post(provider_port, key)}
        proxied = {"name": "proxy", "port": proxy_port, "request": raw_post(proxy_port, bearer)}

        clients.send(
            [
                {
                    "phase": "latency",
                    "targets": [direct, proxied],
                    "count": 2 * args.latency_requests,
                    "seconds": args.latency_seconds,
                }
            ]
        )
        (latency_run,) = clients.answers(1)
        load_after_latency = os.getloadavg()
        rounds = [
            throughput_round(clients, args, target, provider_pid)
            for _ in range(args.rounds)
            for target in (direct, proxied)
        ]
        counts = proxy.close_cell("bench")

    latency = {
        target["name"]: latency_summary(values)
        for target, values in zip((direct, proxied), latency_run["samples"], strict=True)
    }
    proxied_rounds = [entry for entry in rounds if entry["path"] == "proxy"]
    proxy_sent = latency_run["sent"][1] + sum(entry["sent"] for entry in proxied_rounds)
    added_p99 = latency["proxy"]["p99_ms"] - latency["direct"]["p99_ms"]
    proxy_rps = statistics.fmean(entry["rps"] for entry in proxied_rounds)
    proxy_cpu = statistics.fmean(entry["cpu_us_per_request"]["proxy"] for entry in proxied_rounds)
    return {
        "plan": {
            name: getattr(args, name)
            for name in ("clients", "concurrency", "rounds", "round_seconds", "latency_seconds")
        }
        | {"latency_requests_per_path": args.latency_requests, "warmup": WARMUP_REQUESTS},
        "load_average": {"before": load_before, "after_latency": load_after_latency},
        "latency": latency,
        "added_latency_ms": {
            "p50": latency["proxy"]["p50_ms"] - latency["direct"]["p50_ms"],
            "p99": added_p99,
        },
        "throughput_rounds": rounds,
        "proxy_rps_mean": proxy_rps,
        # What one core would pass if the proxy had it to itself: derived, not measured.
        "proxy_rps_per_core_derived": 1e6 / proxy_cpu,
        "cores": os.cpu_count(),
        "seconds": time.monotonic() - started,
        "proxy_posts": {"counted_by_proxy": counts.physical_posts, "sent_by_clients": proxy_sent},
        "targets_met": {
            "added_p99_below_1ms": added_p99 < TARGET_ADDED_P99_MS,
            "at_least_2000_rps": proxy_rps >= TARGET_RPS,
        },
    }


def report(summary: dict[str, Any]) -> None:
    plan = summary["plan"]
    print(
        f"plan: warm-up {plan['warmup']}/connection; latency {plan['latency_requests_per_path']}"
        f" requests/path (cap {plan['latency_seconds']:.0f} s), 1 connection/path, sequential;"
        f" throughput {plan['rounds']} x {plan['round_seconds']:.0f} s/path,"
        f" {plan['clients']} clients x {plan['concurrency']} connections"
    )
    loads = summary["load_average"]
    print(
        "shared box: the load average and 'other work' count everything else running"
        " (on the lab host, a QEMU TCG guest)"
    )
    print(
        f"load average before {loads['before'][0]:.2f}, after latency"
        f" {loads['after_latency'][0]:.2f}"
    )
    latency, added = summary["latency"], summary["added_latency_ms"]
    for name in ("direct", "proxy"):
        row = latency[name]
        print(
            f"latency {name:6} n={row['n']:5}  p50 {row['p50_ms']:.3f} ms  p99"
            f" {row['p99_ms']:.3f} ms  mean {row['mean_ms']:.3f} ms"
        )
    print(
        f"added by the proxy: p50 {added['p50']:.3f} ms, p99 {added['p99']:.3f} ms"
        f" (target p99 < {TARGET_ADDED_P99_MS:.0f} ms)"
    )
    for entry in summary["throughput_rounds"]:
        cpu = entry["cpu_us_per_request"]
        proxy_cpu = f"  proxy {cpu['proxy']:.0f}" if cpu["proxy"] is not None else ""
        print(
            f"throughput {entry['path']:6} {entry['rps']:7.0f} req/s   CPU us/request: clients"
            f" {cpu['clients']:.0f}  provider {cpu['provider']:.0f}{proxy_cpu}   other work"
            f" {entry['other_work_cores']:.2f} of {summary['cores']} cores, load"
            f" {entry['load_average'][0]:.2f}"
        )
    print(
        f"through the proxy: {summary['proxy_rps_mean']:.0f} req/s (mean of the rounds); at its"
        f" CPU per request one core to itself would pass about"
        f" {summary['proxy_rps_per_core_derived']:.0f} req/s (derived, not measured)"
    )
    posts = summary["proxy_posts"]
    print(
        f"proxy counted {posts['counted_by_proxy']} POSTs, clients sent {posts['sent_by_clients']}"
    )
    met = summary["targets_met"]
    print(
        f"targets: added p99 < 1 ms {'met' if met['added_p99_below_1ms'] else 'MISSED'};"
        f" >= 2,000 req/s through the proxy {'met' if met['at_least_2000_rps'] else 'MISSED'}"
        f" ({summary['seconds']:.0f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=2, help="load client processes")
    parser.add_argument("--concurrency", type=int, default=8, help="connections per client")
    parser.add_argument("--latency-requests", type=int, default=3000, help="per path")
    parser.add_argument("--latency-seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds per path")
    parser.add_argument("--round-seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return 0
    planned = (
        STARTUP_ALLOWANCE
        + args.latency_seconds
        + 2 * args.rounds * (START_DELAY + args.round_seconds)
    )
    counts = (args.clients, args.concurrency, args.rounds, args.latency_requests)
    if min(counts) < 1 or min(args.latency_seconds, args.round_seconds) <= 0:
        print("error: every count and duration must be positive", file=sys.stderr)
        return 2
    if planned > MAX_PLAN_SECONDS:
        print(
            f"error: the plan takes about {planned:.0f} s, more than {MAX_PLAN_SECONDS:.0f} s",
            file=sys.stderr,
        )
        return 2
    try:
        summary = run(args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
