"""The credential scan over a directory tree as a guest disk's changed files may be: .debs in
apt's cache (each opened to its data.tar.xz's members), Python's library, logs. Prints the
seconds, the peak memory (RSS) of this process, the bytes read and what the scan found.

    python bench/scan_tree.py DIR
"""

from __future__ import annotations

import resource
import sys
import time
from collections import Counter
from pathlib import Path

from runner.scan.scan import scan

SECRETS = {"provider_key": ["sk-real-provider-key-7f3a9c2e" * 3]}


def main(root: Path) -> int:
    if not root.is_dir():
        print(f"scan_tree: {root} is no directory", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = scan([root], SECRETS, base=root)  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, peak = usage.ru_utime + usage.ru_stime, usage.ru_maxrss >> 10
    print(
        f"{report.files_scanned} files, {report.bytes_scanned >> 20} MiB read: {seconds:.1f} s "
        f"({cpu:.1f} s CPU), peak RSS {peak} MiB; {len(report.leaks)} leaks, "
        f"{len(report.failures)} failures, "
        f"{len(getattr(report, 'searched_as_bytes', ()))} searched as bytes"
    )
    for failure in report.failures[:5]:
        print(f"  failure: {failure.file}: {failure.error}")
    reasons = Counter(entry.reason[:60] for entry in getattr(report, "searched_as_bytes", ()))
    for reason, count in reasons.most_common(5):
        print(f"  as bytes ({count}): {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])) if len(sys.argv) == 2 else 2)
