#!/bin/bash
# Scripted wrong answer for the demo: runs the tasks one after another, ignoring
# max_concurrent, so tasks never overlap. The verifier must give this reward 0.
set -euo pipefail
cat > /app/run.py <<'PY'
async def run_tasks(tasks, max_concurrent):
    for task in tasks:
        await task()
PY
