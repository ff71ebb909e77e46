#!/usr/bin/env bash
# Installs the project's venv, <repo>/.venv, from the host lock. Idempotent; needs no root
# (setup-host.sh runs it after the apt packages it builds with). By hand: bash scripts/install-venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The venv is made from Debian's Python (its system site is externally managed, PEP 668). The
# scripts put .venv/bin first on PATH, so runner, pyinfra, ansible-playbook and python3 are the
# venv's; by hand: `. .venv/bin/activate`.
# Its packages are the host lock's (locks/host/requirements.txt, written by
# scripts/lock-host.sh): every distribution pinned with the hashes of its files, so the judge
# of a run (the statistics, the credential scan, the archive check) is the same on every host
# and every day, and `runner` refuses a venv that differs. Then the project itself, without its
# dependencies (the lock has them) and built with the lock's setuptools (no isolated build:
# nothing unpinned is fetched for it). libvirt-python builds from its locked source (python3-dev,
# build-essential, libvirt-dev, pkg-config) in pip's isolated build environment.
# A complete venv is reused; it is made anew when the lock, pyproject.toml or the checkout's
# path changed (the stamp), or when its runner does not start (as in a venv that differs from
# the lock): anew, not upgraded in place, so nothing the lock dropped stays behind.
venv=$PWD/.venv
lock=locks/host/requirements.txt
stamp="$venv/.frozen-bench-installed"
want="$(sha256sum "$lock" pyproject.toml | cut -d' ' -f1 | tr '\n' ' ')$PWD"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
    || ! env -u PYTHONPATH "$venv/bin/runner" --help >/dev/null 2>&1; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  pip=(env -u PYTHONPATH "$venv/bin/python" -m pip install -q --no-deps)
  "${pip[@]}" --require-hashes -r "$lock"
  "${pip[@]}" --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
