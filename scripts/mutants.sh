#!/usr/bin/env bash
# Mutation testing of the policy core (issue 19) with cargo-mutants
# (`cargo install cargo-mutants --locked`): every mutant of the given files must make
# a policy test fail. File by file (the build is the slow part; one job, so it fits a
# small machine). Results per file under $MUTANTS_OUT (default target/mutants/<file>):
# caught.txt, missed.txt, timeout.txt, unviable.txt.
#
#   scripts/mutants.sh                          # the core files (list below)
#   scripts/mutants.sh src/policy/monitor.rs    # one file
#   scripts/mutants.sh --in-diff changes.diff   # only mutants in changed policy lines
#
# Tests run: the library's policy tests, tests/policy_props.rs and tests/policy_units.rs
# (`cargo test --lib --test policy_props --test policy_units -- policy:: decisions_follow
# routing_respects`): the unit tests of the module under test, the properties over it
# and the unit tests written against missed mutants, not the slow end-to-end tests.
# Timeouts: 30 s per test run (the policy tests take ~5 s; a mutant that loops forever
# is a timeout), 900 s per build. MUTANTS_BASELINE=skip skips the unmutated run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || {
  echo "cargo-mutants is required: cargo install cargo-mutants --locked" >&2; exit 2; }

CORE=(monitor scaling controller balancer cost functions placement timers attempt core)
out_root=${MUTANTS_OUT:-${CARGO_TARGET_DIR:-target}/mutants}
common=(--test-tool cargo -j 1 --timeout "${MUTANTS_TIMEOUT:-30}"
        --build-timeout "${MUTANTS_BUILD_TIMEOUT:-900}" --no-shuffle)
# Extra cargo-mutants options, e.g. MUTANTS_EXTRA='-E monitor.rs:(99|109):' to leave
# out mutants already tested.
# shellcheck disable=SC2206
common+=(${MUTANTS_EXTRA:-})
# Only these three test targets are built and run for each mutant (`-C`: every cargo
# call, the build included; without it `cargo test --no-run` links every integration
# test and the binary for each mutant).
common+=(-C --lib -C --test=policy_props -C --test=policy_units)
# MUTANTS_TEST_EXTRA: more test-harness arguments, e.g. '--skip policy::rmax::' to leave
# out the tests of modules the mutated file's code cannot reach.
# shellcheck disable=SC2206
test_args=(-- -- policy:: decisions_follow routing_respects ${MUTANTS_TEST_EXTRA:-})

status=0
summary() { # dir label
  local d=$1/mutants.out n c
  printf '%-34s' "$2"
  for n in caught missed timeout unviable; do
    c=$(grep -c . "$d/$n.txt" 2>/dev/null || true)
    printf ' %s %3d' "$n" "${c:-0}"
  done
  echo
}

if [ "${1:-}" = "--in-diff" ]; then
  diff=$2
  # Only policy code: a diff that touches no src/policy/*.rs line has no mutant.
  if ! grep -qE '^\+\+\+ b/src/policy/.*\.rs' "$diff"; then
    echo "mutants: the diff touches no policy code"; exit 0
  fi
  mkdir -p "$out_root/in-diff"
  cargo mutants "${common[@]}" --in-diff "$diff" --file 'src/policy/**/*.rs' \
    --output "$out_root/in-diff" "${test_args[@]}" || status=$?
  summary "$out_root/in-diff" "in-diff"
  exit "$status"
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for f in "${CORE[@]}"; do files+=("src/policy/$f.rs"); done
fi
baseline=${MUTANTS_BASELINE:-run}
for f in "${files[@]}"; do
  name=$(basename "$f" .rs)
  mkdir -p "$out_root/$name"
  rc=0
  cargo mutants "${common[@]}" --baseline "$baseline" --file "$f" \
    --output "$out_root/$name" "${test_args[@]}" || rc=$?
  # 0: all caught; 2: some missed; 3: some timed out (cargo-mutants exit codes).
  [ "$rc" -eq 0 ] || status=$rc
  summary "$out_root/$name" "$f"
  baseline=skip # the unmutated tree passed once; later files skip that build
done
exit "$status"
