#!/usr/bin/env bash
# Check deploy/systemd/spillway.service against the built binary:
#   * `systemd-analyze verify` on a copy whose /usr/local/bin/spillway is the built binary
#     (so ExecStart/ExecStartPre must name an executable that exists), with the man pages
#     the binary writes (`spillway man --dir`) on MANPATH for Documentation=; any warning
#     (unknown key, bad value) fails the check, not only errors;
#   * the subcommands the unit runs (`serve`, `check`) exist in that binary;
#   * `systemd-analyze security --offline=true`: the exposure level stays at or below
#     SPILLWAY_UNIT_MAX_EXPOSURE (default 1.5 on systemd's 0-10 scale; the unit scores 1.3
#     with systemd 252).
#
#   scripts/check-systemd-unit.sh [BINARY]   # default: $CARGO_TARGET_DIR/debug/spillway
#                                            # (built with `cargo build --locked` when missing)
# Prints "systemd unit check skipped: <reason>" and exits 0 when systemd-analyze is missing
# or too old for an offline review (systemd < 250).
set -euo pipefail
cd "$(dirname "$0")/.."

skip() { echo "systemd unit check skipped: $*"; exit 0; }
fail() { echo "check-systemd-unit: $*" >&2; exit 1; }

unit=deploy/systemd/spillway.service
command -v systemd-analyze >/dev/null || skip "systemd-analyze is not installed (apt-get install systemd)"
version=$(systemd-analyze --version | awk 'NR == 1 { print $2 }')
[ "${version%%[!0-9]*}" -ge 250 ] 2>/dev/null \
  || skip "systemd $version has no offline security review (250 or later needed)"

target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/spillway}"
if [ ! -x "$bin" ]; then
  [ $# -eq 0 ] || fail "$bin is not an executable"
  echo "== cargo build --locked --bin spillway (for the unit check)"
  cargo build --locked --bin spillway
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -q '/usr/local/bin/spillway' "$unit" || fail "$unit no longer runs /usr/local/bin/spillway"
sed "s#/usr/local/bin/spillway#$bin#g" "$unit" >"$tmp/spillway.service"
mkdir -p "$tmp/man/man1"
"$bin" man --dir "$tmp/man/man1"

for sub in $(grep -E '^ExecStart(Pre)?=' "$unit" | awk '{ print $2 }'); do
  "$bin" "$sub" --help >/dev/null 2>&1 || fail "the unit runs \`spillway $sub\`, which this binary does not have"
done

echo "== systemd-analyze verify $unit (ExecStart: $bin)"
# Run from the temporary directory: verify also loads units from the working directory.
out=$(cd "$tmp" && MANPATH="$tmp/man" systemd-analyze verify ./spillway.service 2>&1) \
  || { printf '%s\n' "$out" >&2; fail "systemd-analyze verify failed"; }
[ -z "$out" ] || { printf '%s\n' "$out" >&2; fail "systemd-analyze verify warned (see above)"; }

max="${SPILLWAY_UNIT_MAX_EXPOSURE:-1.5}"
review=$(cd "$tmp" && systemd-analyze security --offline=true --no-pager ./spillway.service 2>&1) \
  || { printf '%s\n' "$review" >&2; fail "systemd-analyze security failed"; }
level=$(printf '%s\n' "$review" | sed -n 's/.*Overall exposure level for spillway.service: \([0-9.]*\).*/\1/p')
[ -n "$level" ] || { printf '%s\n' "$review" >&2; fail "no exposure level in systemd-analyze security's output"; }
awk -v l="$level" -v m="$max" 'BEGIN { exit !(l <= m) }' || {
  printf '%s\n' "$review" | grep '^✗' >&2 || true
  fail "exposure level $level is above $max (the ✗ lines above are what is not hardened)"
}
echo "systemd unit ok: verify clean, exposure level $level (at most $max)"
