#!/usr/bin/env bash
# Mutation testing of the policy core with cargo-mutants
# (`cargo install cargo-mutants --locked`): every mutant of the given files must make
# a policy test fail. One job by default (MUTANTS_JOBS=2: two copies building and testing
# side by side); shards through MUTANTS_EXTRA (`--shard 0/2`). Results under $MUTANTS_OUT/policy/mutants.out
# ($MUTANTS_OUT/in-diff/mutants.out for --in-diff; MUTANTS_OUT defaults to
# ${CARGO_TARGET_DIR:-target}/mutants): caught.txt, missed.txt, timeout.txt,
# unviable.txt, and a count per file on stdout.
#
#   scripts/mutants.sh                          # every file of src/policy
#   scripts/mutants.sh src/policy/monitor.rs    # one file
#   scripts/mutants.sh --in-diff changes.diff   # only mutants in changed policy lines
#
# Tests run: every test of the policy crate (src/policy is its own crate,
# spillway-policy): its unit tests and every src/policy/tests/*.rs
# (`cargo test -p spillway-policy`, ~4 s on an idle machine). Only that crate is rebuilt per mutant (~2 s), not the gateway.
# Timeouts: 30 s per test run (a mutant that loops forever is a timeout), 300 s per
# build. MUTANTS_BASELINE=skip skips the unmutated run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || {
  echo "cargo-mutants is required: cargo install cargo-mutants --locked" >&2; exit 2; }

out_root=${MUTANTS_OUT:-${CARGO_TARGET_DIR:-target}/mutants}
# cargo-mutants builds each mutant in a copy of the tree, but with CARGO_TARGET_DIR set
# the copy builds into that shared directory: the last mutant's spillway-policy (same
# crate hash: cargo hashes paths relative to the workspace) stays there and a later
# `cargo test` of the real tree can take it as fresh and fail (seen). So the copies
# build in their own target directory (~20 s more for the unmutated build).
mutants() { env -u CARGO_TARGET_DIR cargo mutants "$@"; }
common=(--package spillway-policy --test-tool cargo -j "${MUTANTS_JOBS:-1}" --timeout "${MUTANTS_TIMEOUT:-30}"
        --build-timeout "${MUTANTS_BUILD_TIMEOUT:-300}" --no-shuffle)
# Extra cargo-mutants options, e.g. MUTANTS_EXTRA='-E monitor.rs:(99|109):' to leave
# out mutants already tested.
# shellcheck disable=SC2206
common+=(${MUTANTS_EXTRA:-})
# The mutated file's package only (cargo-mutants' default): spillway-policy. Extra
# test-harness arguments, e.g. MUTANTS_TEST_EXTRA='--skip rmax::' to leave out the tests
# of modules the mutated file's code cannot reach.
# shellcheck disable=SC2206
test_args=(-- -- ${MUTANTS_TEST_EXTRA:-})

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
  mutants "${common[@]}" --in-diff "$diff" --file 'src/policy/**/*.rs' \
    --output "$out_root/in-diff" "${test_args[@]}" || status=$?
  summary "$out_root/in-diff" "in-diff"
  exit "$status"
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(src/policy/*.rs)
fi
# One cargo-mutants run over every file: one copy of the tree, one unmutated build.
args=()
for f in "${files[@]}"; do args+=(--file "$f"); done
out="$out_root/policy"
mkdir -p "$out"
mutants "${common[@]}" --baseline "${MUTANTS_BASELINE:-run}" "${args[@]}" \
  --output "$out" "${test_args[@]}" || status=$?
# 0: all caught; 2: some missed; 3: some timed out (cargo-mutants exit codes).
for f in "${files[@]}"; do
  printf '%-34s' "$f"
  for n in caught missed timeout unviable; do
    c=$(grep -c "^$f:" "$out/mutants.out/$n.txt" 2>/dev/null || true)
    printf ' %s %3d' "$n" "${c:-0}"
  done
  echo
done
exit "$status"
