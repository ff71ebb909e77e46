"""The credential scan's speed on one 50 MiB mixed file: log lines, JSON with base64 blobs,
UTF-16 text and random binary, as a run's retained artifacts mix them. The scan runs over every
retained artifact of every run, so its MB/s bounds how long a run's end takes.

    python bench/scan_speed.py [MiB]
"""

from __future__ import annotations

import base64
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from runner.proxy.bearer import new_bearer
from runner.scan.scan import scan

SECRETS = {
    "provider_key": ["sk-real-provider-key-7f3a9c2e" * 3],
    "bearer": [new_bearer() for _ in range(36)],  # a 36-cell run's
}


def mixed(size: int) -> bytes:
    """``size`` bytes in 64 KiB pieces of four kinds, the same bytes on every call."""
    rng = random.Random(24)
    pieces: list[bytes] = []
    total = 0
    while total < size:
        kind = rng.randrange(4)
        if kind == 0:
            piece = b"".join(
                b"2026-12-02T13:00:00Z INFO agent step %d: ran `ls -la /app`, 17 files\n" % i
                for i in range(900)
            )
        elif kind == 1:
            blob = base64.b64encode(rng.randbytes(48 << 10)).decode()
            piece = json.dumps({"role": "user", "image": blob, "text": "look"}).encode()
        elif kind == 2:
            piece = ("Überprüfung der Ausgabe, Schritt 12: in Ordnung\r\n" * 650).encode("utf-16")
        else:
            piece = rng.randbytes(64 << 10)
        pieces.append(piece)
        total += len(piece)
    return b"".join(pieces)[:size]


def main(mib: int) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "mixed.bin").write_bytes(mixed(mib << 20))
        started = time.perf_counter()
        report = scan([root], SECRETS, base=root)  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
    print(
        f"{mib} MiB mixed: {seconds:.2f} s ({mib / seconds:.1f} MiB/s), "
        f"{len(report.leaks)} leaks, {len(report.failures)} failures"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
