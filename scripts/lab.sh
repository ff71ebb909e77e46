#!/usr/bin/env bash
# The README's first command: set up the host, resolve the lock's artifacts into the host cache,
# build or reuse the image, deploy the lab VM and provision its guest offline, freeze it, run
# the lock's schedule end to end, then archive the run and check the archive as a reviewer would
# (against the operator's public key in the cache, the one that signed it). LOCK (default
# locks/demo.toml), LAB (default "default") and RUN_DIR (default runs/<lock>-<UTC time>) choose
# what and where.
set -euo pipefail
cd "$(dirname "$0")/.."

export LOCK=${LOCK:-locks/demo.toml}
export LAB=${LAB:-default}
run_dir=${RUN_DIR:-runs/$(basename "$LOCK" .toml)-$(date -u +%Y%m%dT%H%M%SZ)}

bash scripts/setup-host.sh
# The project's venv (made by setup-host.sh): runner and pyinfra below are its commands.
export PATH="$PWD/.venv/bin:$PATH"
source scripts/git-sources.sh
# Each step's header says how long the one before it took (the figures a run's note gives).
step_started=$SECONDS
step() {
  printf '\n== %s (%s UTC; the step before took %d s)\n' "$*" "$(date -u +%H:%M:%S)" \
    "$(( SECONDS - step_started ))"
  step_started=$SECONDS
}

step "resolve $LOCK into the host artifact cache"
runner resolve "$LOCK"
step "image, lab VM and guest (pyinfra)"
pyinfra -y inventory/local.py deploy.py
step "freeze lab $LAB"
runner freeze --lab "$LAB" --lock "$LOCK"
step "execute $LOCK in $run_dir"
runner execute "$LOCK" --run-dir "$run_dir" --lab "$LAB"
step "archive $run_dir and check it against the operator's key"
runner archive "$run_dir"
runner check-archive "$run_dir.tar.gz" --key "${FROZEN_BENCH_CACHE:-.cache}/operator-key/id_ed25519.pub"
step "done"
printf '\nreport: %s/report.md  receipt: %s/receipt.json  archive: %s.tar.gz\n' \
  "$run_dir" "$run_dir" "$run_dir"
