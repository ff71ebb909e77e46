#!/usr/bin/env bash
# Cold vs warm `runner resolve LOCK` in a fresh cache directory: seconds and bytes.
# Goal: a warm resolve downloads nothing. Usage: bench/artifact_cache.sh LOCK [CACHE_DIR]
set -euo pipefail
venv_bin="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"  # the project's venv (scripts/setup-host.sh)
[ -x "$venv_bin/runner" ] && export PATH="$venv_bin:$PATH"
lock=${1:?usage: bench/artifact_cache.sh LOCK [CACHE_DIR]}
cache=${2:-$(mktemp -d)}
export FROZEN_BENCH_CACHE=$cache
for run in cold warm; do
  start=$(date +%s.%N)
  runner resolve "$lock"
  echo "$run: $(echo "$(date +%s.%N) - $start" | bc) s"
done
echo "store: $(du -sb "$cache/artifacts" | cut -f1) bytes in $cache/artifacts"
