"""Runs /app/run.py's run_tasks on probe tasks and prints what happened, one event per line.

Each probe task prints ``start i``, works (sleeps), prints ``done i``; its ``finally`` awaits a
short cleanup and then prints ``cleanup i``. At the end: ``peak N`` (most tasks running at
once), or ``interrupted`` when a SIGINT stopped the run.
"""

import argparse
import asyncio
import sys

sys.path.insert(0, "/app")
from run import run_tasks

running = 0
peak = 0


def probe(index: int, work: float):
    async def task() -> None:
        global running, peak
        running += 1
        peak = max(peak, running)
        print(f"start {index}", flush=True)
        try:
            await asyncio.sleep(work)
            print(f"done {index}", flush=True)
        finally:
            await asyncio.sleep(0.2)
            running -= 1
            print(f"cleanup {index}", flush=True)

    return task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--max-concurrent", type=int, required=True)
    parser.add_argument("--work", type=float, required=True)
    args = parser.parse_args()
    tasks = [probe(i, args.work) for i in range(args.tasks)]
    try:
        asyncio.run(run_tasks(tasks, args.max_concurrent))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print(f"peak {peak}", flush=True)


if __name__ == "__main__":
    main()
