#!/usr/bin/env bash
# The project's test command (README, .ci/run): sets up the host, then runs the tiers in order —
#   fast   pytest -m "not vm"                       host only: models, proxy, scan, libvirt test driver
#   vm     pytest -m "vm and not guest and not e2e" image build, deploy, teardown, rebuild (lab "pytest")
#   guest  pytest -m "guest and not e2e"            provisioned guest, freeze, verify, reset (lab "vmtest")
#   e2e    pytest -m e2e                            runner execute of the demo lock in that guest and,
#                                                   at the same time, the real tasks (locks/tb21.toml)
#                                                   in lab "tb21" (its log: .cache/e2e-tb21.log)
# TIERS="fast vm" runs a subset. pytest's exit code 5 ("no tests collected") counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-host.sh || exit 1
# The project's venv (made by setup-host.sh) first: python3, runner, pyinfra and ansible-playbook
# here and in every test's subprocess are the venv's.
export PATH="$PWD/.venv/bin:$PATH"
source scripts/git-sources.sh
tiers=${TIERS:-fast vm guest e2e}
mkdir -p .cache

# The README's commands need nothing but Debian's own Python: setup-host.sh again, then the
# venv's runner, with a stock PATH (no pyenv, no ~/.local, no activated venv). Idempotent, ~2 s.
stock_python_check() {
  [[ " $tiers " == *" fast "* ]] || return 0
  echo "== stock Debian PATH: setup-host.sh and .venv/bin/runner --help without any other Python"
  local stock=(env -u PYTHONPATH -u VIRTUAL_ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin)
  "${stock[@]}" bash scripts/setup-host.sh || exit 1
  "${stock[@]}" .venv/bin/runner --help >/dev/null || exit 1
}

stock_python_check

# The cold arm64 image build (~15-20 min under emulation, about one core) is the longest step:
# it starts now, beside the fast tier, and the VM tiers wait for it. A cached image returns at once.
image_build_pid=
if [[ " $tiers " == *" vm "* || " $tiers " == *" guest "* || " $tiers " == *" e2e "* ]]; then
  python3 -m images build locks/demo.toml > .cache/image-build.log 2>&1 &
  image_build_pid=$!
fi

wait_for_image() {
  [ -n "$image_build_pid" ] || return 0
  echo "== waiting for the image build (log: .cache/image-build.log)"
  wait "$image_build_pid" || { tail -20 .cache/image-build.log >&2; exit 1; }
  image_build_pid=
}

run_tier() {
  local name=$1; shift
  [[ " $tiers " == *" $name "* ]] || return 0
  [ "$name" = fast ] || wait_for_image
  echo "== tier: $name ($(date -u +%H:%M:%S))"
  python3 -m pytest "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "tier $name collected no tests: failing" >&2
    exit 1
  elif [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
}

run_tier fast -m "not vm" "$@"

# The oldest scipy pyproject allows must run the report's statistics: that release alone is
# installed into a directory of its own and put before the venv's for the statistics and
# report tests (one wheel from PyPI; the synthetic-ledger rates are left to the fast tier).
scipy_floor_check() {
  [[ " $tiers " == *" fast "* ]] || return 0
  local floor
  floor=$(python3 -c 'import tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(d.split(">=")[1].split(",")[0].strip() for d in deps if d.startswith("scipy>=")))')
  echo "== scipy $floor (pyproject's floor): the statistics and report tests"
  local target=.cache/scipy-floor-$floor
  [ -d "$target/scipy" ] || python3 -m pip install --quiet --no-deps --target "$target" "scipy==$floor" || exit 1
  PYTHONPATH="$target" python3 -c "import scipy; from packaging.version import Version as V; assert V(scipy.__version__) == V('$floor'), scipy.__version__" || exit 1
  PYTHONPATH="$target" python3 -m pytest -q -p no:cacheprovider tests/test_report_stats.py \
    tests/test_analysis.py tests/test_reference_report.py || exit 1
}
scipy_floor_check
# The real tasks' lab (tb21, its own VM) is deployed and frozen (with each task's oracle) in the
# background (once the image is built) while the vm and guest tiers run: a TCG guest mostly keeps
# one host core busy, so two overlap. The e2e tier finds it deployed and frozen
# (tests/support/vm_fixtures.py).
tb21_pid=
start_real_tasks_lab() {
  [[ " $tiers " == *" e2e "* ]] || return 0
  wait_for_image
  echo "== lab tb21 (locks/tb21.toml): deploy and freeze in the background (log: .cache/tb21-lab.log)"
  (
    export LAB=tb21 LOCK=locks/tb21.toml
    runner resolve "$LOCK" && pyinfra -y inventory/local.py deploy.py \
      && runner freeze --lab "$LAB" --lock "$LOCK"
  ) > .cache/tb21-lab.log 2>&1 &
  tb21_pid=$!
}

wait_for_real_tasks_lab() {
  [ -n "$tb21_pid" ] || return 0
  echo "== waiting for lab tb21 ($(date -u +%H:%M:%S))"
  wait "$tb21_pid" || { tail -30 .cache/tb21-lab.log >&2; exit 1; }
  tb21_pid=
}

# The real tasks' cells run in their own lab beside the demo's: two TCG guests share the two
# cores, and each tier's wall is mostly emulated Harbor and Podman, not the host.
run_e2e_tiers() {
  [[ " $tiers " == *" e2e "* ]] || return 0
  echo "== tier: e2e, lab tb21 in the background (log: .cache/e2e-tb21.log)"
  python3 -m pytest -m e2e tests/test_real_tasks_vm.py "$@" > .cache/e2e-tb21.log 2>&1 &
  local tb21_tests=$!
  run_tier e2e -m e2e --ignore tests/test_real_tasks_vm.py "$@"
  wait "$tb21_tests"
  local rc=$?
  echo "== lab tb21's e2e tests ($(date -u +%H:%M:%S)):"
  cat .cache/e2e-tb21.log
  [ "$rc" -eq 0 ] || { echo "lab tb21's e2e tests failed ($rc)" >&2; exit 1; }
}

start_real_tasks_lab
run_tier vm -m "vm and not guest and not e2e" "$@"
run_tier guest -m "guest and not e2e" "$@"
wait_for_real_tasks_lab
run_e2e_tiers "$@"
echo "== all tiers passed ($(date -u +%H:%M:%S))"
