"""Harnesses the host tests run for real. OMP runs on an x86_64 host (its linux-x64 natives are
on the npm registry) but not in an arm64 guest, so the demo lock leaves it out."""

from __future__ import annotations

from runner.spec.lock import Harness, Lock, PinnedPackage

HOST_HARNESSES = {
    "pi": Harness(
        id="bare-pi",
        label="Bare Pi",
        agent="pi",
        runtime="node",
        package=PinnedPackage(source="npm:@earendil-works/pi-coding-agent@0.84.2"),
    ),
    "omp": Harness(
        id="omp",
        label="OMP",
        agent="omp",
        runtime="bun",
        package=PinnedPackage(source="npm:@oh-my-pi/pi-coding-agent@17.2.15"),
    ),
}


def with_host_omp(lock: Lock) -> Lock:
    """``lock`` with the host's OMP harness added (when it has none)."""
    if any(harness.id == "omp" for harness in lock.harnesses):
        return lock
    return lock.model_copy(update={"harnesses": (*lock.harnesses, HOST_HARNESSES["omp"])})
