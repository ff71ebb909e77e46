#!/usr/bin/env bash
# Writes the host lock, locks/host/requirements.txt: every distribution of the host venv
# (pyproject's dependencies and its [dev] extra) pinned with the sha256 of each of its files,
# resolved for this host's kind (CPython 3.11 on x86_64 Debian 12, glibc 2.36) wherever it runs.
# setup-host.sh installs the venv from it; `runner` refuses a venv that differs from it.
# Run after changing pyproject's dependencies, or to take newer releases: bash scripts/lock-host.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# uv is in the [dev] extra, so the venv setup-host.sh made has it.
exec .venv/bin/uv pip compile pyproject.toml --extra dev \
  --generate-hashes \
  --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
  --custom-compile-command "bash scripts/lock-host.sh" \
  --quiet --output-file locks/host/requirements.txt "$@"
