#!/usr/bin/env bash
# The project's test command (README, .ci/run):
#   bash scripts/test.sh         the CI set: <= 40 min from a cold fresh clone (what .ci/run runs)
#   bash scripts/test.sh full    everything: run it before an issue is resolved
#   bash scripts/test.sh [ci|full] PYTEST-ARGS...   the same, with arguments for every pytest tier
#
# tier    set      pytest selection                       lab (tests/support/run_labs.py)
# fast    ci       -m "not vm and not registry"           none: host only, no route to a registry needed
#         full     -m "not vm" (the real registries too)
# floor   full     scipy at pyproject's floor: the statistics and report tests
# vm      ci       -m "vm and not guest and not e2e and not smoke and not full"   <run>-deploy
#         full     -m "vm and not guest and not e2e and not smoke"
# smoke   ci/full  -m smoke                               <run>-smoke, deployed and frozen beside the
#                                                         tiers before it (log: .cache/smoke-lab.log)
# guest   full     -m "guest and not e2e"                 <run>-demo
# e2e     full     -m e2e: the demo's cells in <run>-demo and, beside them, the real tasks in
#                  <run>-tb21 (deployed and frozen in the background; logs .cache/tb21-*.log)
#
# Every lab is this run's own ($FROZEN_BENCH_TEST_RUN, fresh per run) and is torn down when the
# run ends, passed or not. The run ends with a table of each tier's wall time and appends one line
# to ~/.cache/frozen-bench/test-runs.jsonl (tests/support/run_record.py). TIERS="fast vm" runs a
# subset of the set's tiers. pytest's exit code 5 ("no tests collected") counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."

# The set is the first argument (ci when none); any other arguments go to every pytest tier.
test_set=ci
case "${1:-}" in
  ci | full) test_set=$1; shift ;;
esac
case "$test_set" in
  ci) all_tiers="fast vm smoke" ;;
  full) all_tiers="fast floor vm smoke guest e2e" ;;
esac
tiers=${TIERS:-$all_tiers}
export FROZEN_BENCH_TEST_RUN=${FROZEN_BENCH_TEST_RUN:-t$(date -u +%m%d%H%M%S)-$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')}
run_started=$(date +%s)
mkdir -p .cache
tier_times=.cache/test-run-$FROZEN_BENCH_TEST_RUN.tsv
: > "$tier_times"
verdict=failed
background_pids=()

# When the run ends, passed or failed or killed: stop what it started in the background, tear
# down its labs, print the tier table and record the run.
finish() {
  local pid
  # The tier's pytest first (a child of this script; its own tier may be waiting on it), then
  # the background jobs' process groups.
  pkill -TERM -P $$ 2>/dev/null
  for pid in "${background_pids[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ -x .venv/bin/python ]; then
    echo "== tearing down this run's labs ($FROZEN_BENCH_TEST_RUN)"
    .venv/bin/python -m tests.support.run_labs teardown || true
    .venv/bin/python -m tests.support.run_record "$tier_times" --set "$test_set" \
      --verdict "$verdict" --wall "$(( $(date +%s) - run_started ))" || true
  fi
  rm -f "$tier_times" "$image_ready" .cache/lab-ready-"$FROZEN_BENCH_TEST_RUN"-*
}
trap finish EXIT
trap 'exit 143' TERM INT

has_tier() { [[ " $tiers " == *" $1 "* ]]; }
# A step's wall time goes in the table under its tier's name.
timed() {
  local name=$1; shift
  local started=$SECONDS
  "$@"
  local rc=$?
  printf '%s\t%s\n' "$name" "$(( SECONDS - started ))" >> "$tier_times"
  return "$rc"
}

setup() {
  bash scripts/setup-host.sh || return 1
  # The README's commands need nothing but Debian's own Python: setup-host.sh again, then the
  # venv's runner, with a stock PATH (no pyenv, no ~/.local, no activated venv). ~2 s.
  echo "== stock Debian PATH: setup-host.sh and .venv/bin/runner --help without any other Python"
  local stock=(env -u PYTHONPATH -u VIRTUAL_ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin)
  "${stock[@]}" bash scripts/setup-host.sh && "${stock[@]}" .venv/bin/runner --help >/dev/null
}
timed setup setup || exit 1
# The project's venv (made by setup-host.sh) first: python3, runner, pyinfra and ansible-playbook
# here and in every test's subprocess are the venv's.
export PATH="$PWD/.venv/bin:$PATH"
source scripts/git-sources.sh

# A command (or function) in the background, in a process group of its own (job control on for
# the moment it starts), so that finish() stops all of it.
background() {
  local log=$1; shift
  set -m
  "$@" > "$log" 2>&1 &
  background_pids+=($!)
  set +m
}

# The cold arm64 image build (~5-15 min under emulation, about one core) is the longest step: it
# starts now, beside the fast tier (a cached image returns at once); as soon as it is built, the
# labs the later tiers need are deployed and frozen, in the background too, one VM each; each
# lab's ready mark lets the tier that needs it start without waiting for the others.
image_ready=.cache/image-ready-$FROZEN_BENCH_TEST_RUN
rm -f "$image_ready"
labs=()
has_tier smoke && labs+=("smoke locks/smoke.toml")
has_tier e2e && labs+=("tb21 locks/tb21.toml")
lab_ready() { echo ".cache/lab-ready-$FROZEN_BENCH_TEST_RUN-$1"; }
build_image_then_labs() {
  python3 -m images build locks/smoke.toml > .cache/image-build.log 2>&1 || return 1
  touch "$image_ready"
  local lab pids=() failed=0
  for lab in "${labs[@]}"; do
    # shellcheck disable=SC2086  # role and lock: two words
    { python3 -m tests.support.run_labs deploy $lab --freeze && touch "$(lab_ready "${lab%% *}")"; } \
      > ".cache/${lab%% *}-lab.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return "$failed"
}
builder=
if has_tier vm || has_tier smoke || has_tier guest || has_tier e2e; then
  background .cache/labs-build.log build_image_then_labs
  builder=${background_pids[-1]}
fi

show_logs() {
  local log
  for log in "$@"; do
    [ -f "$log" ] && { echo "-- $log" >&2; tail -30 "$log" >&2; }
  done
}

wait_for_image() {
  [ -n "$builder" ] || return 0
  echo "== waiting for the image ($(date -u +%H:%M:%S); log: .cache/image-build.log)"
  until [ -e "$image_ready" ]; do
    kill -0 "$builder" 2>/dev/null || { show_logs .cache/image-build.log; return 1; }
    sleep 2  # polling for the build's end mark
  done
}

# A tier waits for its own lab only: the smoke tier need not wait for lab tb21's freeze.
wait_for_lab() {
  local role=$1
  [ -n "$builder" ] || return 0
  echo "== waiting for lab $role ($(date -u +%H:%M:%S); log: .cache/$role-lab.log)"
  until [ -e "$(lab_ready "$role")" ]; do
    if ! kill -0 "$builder" 2>/dev/null; then
      [ -e "$(lab_ready "$role")" ] && break
      show_logs .cache/image-build.log ".cache/$role-lab.log"
      return 1
    fi
    sleep 2  # polling for the lab's ready mark
  done
}

pytest_tier() {
  echo "== tier: $1 ($(date -u +%H:%M:%S))"
  shift
  # In the background and waited for, so that a SIGTERM to this script is handled at once
  # (bash runs a trap only after a foreground child ends) and finish() stops this pytest.
  python3 -m pytest "$@" &
  wait $!
  local rc=$?
  [ "$rc" -eq 5 ] && { echo "collected no tests: failing" >&2; return 1; }
  return "$rc"
}

run_tier() {
  local name=$1; shift
  has_tier "$name" || return 0
  timed "$name" "$@" || { echo "tier $name failed" >&2; exit 1; }
}

fast_selection="not vm and not registry"
[ "$test_set" = full ] && fast_selection="not vm"
run_tier fast pytest_tier fast -m "$fast_selection" "$@"

# The oldest scipy pyproject allows must run the report's statistics: that release alone is
# installed into a directory of its own and put before the venv's for the statistics and
# report tests (one wheel from PyPI; the synthetic-ledger rates are left to the fast tier).
scipy_floor() {
  local floor target
  floor=$(python3 -c 'import tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(d.split(">=")[1].split(",")[0].strip() for d in deps if d.startswith("scipy>=")))')
  echo "== scipy $floor (pyproject's floor): the statistics and report tests"
  target=.cache/scipy-floor-$floor
  [ -d "$target/scipy" ] || python3 -m pip install --quiet --no-deps --target "$target" "scipy==$floor" || return 1
  PYTHONPATH="$target" python3 -c "import scipy; from packaging.version import Version as V; assert V(scipy.__version__) == V('$floor'), scipy.__version__" || return 1
  # Not the host lock's scipy, on purpose: the runner is told so (its receipts record it).
  PYTHONPATH="$target" FROZEN_BENCH_UNLOCKED_HOST=1 python3 -m pytest -q -p no:cacheprovider \
    tests/test_report_stats.py tests/test_interval_coverage.py \
    tests/test_analysis.py tests/test_reference_report.py
}
run_tier floor scipy_floor

# The vm tier makes (and removes) its own lab; it needs the image only.
vm_selection="vm and not guest and not e2e and not smoke"
[ "$test_set" = ci ] && vm_selection="$vm_selection and not full"
vm_tier() { wait_for_image && pytest_tier vm -m "$vm_selection" "$@"; }
run_tier vm vm_tier "$@"

smoke_tier() { wait_for_lab smoke && pytest_tier smoke -m smoke "$@"; }
run_tier smoke smoke_tier "$@"

guest_tier() {
  rm -f .cache/audit-figures.log
  pytest_tier guest -m "guest and not e2e" "$@" || return 1
  if [ -f .cache/audit-figures.log ]; then
    echo "== the audit's figures in the guest tier (tests/test_freeze_vm.py):"
    cat .cache/audit-figures.log
  fi
}
run_tier guest guest_tier "$@"

# The real tasks' cells run in their own lab beside the demo's: two TCG guests share the two
# cores, and each side's wall is mostly emulated Harbor and Podman, not the host.
e2e_tier() {
  wait_for_lab tb21 || return 1
  echo "== e2e: lab tb21's tests in the background (log: .cache/tb21-e2e.log)"
  python3 -m pytest -m e2e tests/test_real_tasks_vm.py "$@" > .cache/tb21-e2e.log 2>&1 &
  local tb21_tests=$!
  pytest_tier e2e -m e2e --ignore tests/test_real_tasks_vm.py "$@"
  local demo_rc=$?
  wait "$tb21_tests"
  local tb21_rc=$?
  echo "== lab tb21's e2e tests ($(date -u +%H:%M:%S)):"
  cat .cache/tb21-e2e.log
  [ "$demo_rc" -eq 0 ] || { echo "the demo's e2e tests failed ($demo_rc)" >&2; return 1; }
  [ "$tb21_rc" -eq 0 ] || { echo "lab tb21's e2e tests failed ($tb21_rc)" >&2; return 1; }
}
run_tier e2e e2e_tier "$@"

verdict=passed
echo "== the $test_set set passed ($(date -u +%H:%M:%S))"
