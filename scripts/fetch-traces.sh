#!/usr/bin/env bash
# Fetch the per-second request traces that the examples (README, manual) and the benchmarks
# replay (WITS and the square wave from the LIBRA authors' repository) into traces/.
#
#   scripts/fetch-traces.sh               # download from GitHub (pinned commits)
#   scripts/fetch-traces.sh --from DIR    # copy from an offline directory instead
#   scripts/fetch-traces.sh --dest DIR    # somewhere other than traces/
#
# The files are not committed: their repository (aliraza0337/LIBRA) states no licence.
# Every file is checked against its sha256 sum; a file already present with the right
# sum is kept. Exit status: 0 when every trace is in place, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

from=""
dest="traces"
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="${2:?--from needs a directory}"; shift 2 ;;
    --dest) dest="${2:?--dest needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-traces: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# name | sha256 | source URL (raw file at a pinned commit)
traces=(
  "wits_per_second.txt|2c098873d49b6db5e1c2dc94896c2c4f05ff4ce3286f3a87c5f4d702459bed74|https://raw.githubusercontent.com/aliraza0337/LIBRA/bc7b3fe72acb7af200952ead6f27e47942b199a1/traces/wits_logs.txt"
  "square_per_second.txt|91efbc99e0d079342555d9d983ae9a847ad9ac06fe0d01f2939686d6aa118966|https://raw.githubusercontent.com/aliraza0337/LIBRA/29cf270806845e38dac6cf00cac7d915e64847e0/traces/square_load.txt"
)

sum_of() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

mkdir -p "$dest"
status=0
for entry in "${traces[@]}"; do
  IFS='|' read -r name sum url <<<"$entry"
  target="$dest/$name"
  if [ -f "$target" ] && [ "$(sum_of "$target")" = "$sum" ]; then
    echo "ok      $target (already present)"
    continue
  fi
  tmp="$(mktemp "$dest/.$name.XXXXXX")"
  if [ -n "$from" ]; then
    if ! cp "$from/$name" "$tmp" 2>/dev/null; then
      echo "missing $from/$name" >&2; rm -f "$tmp"; status=1; continue
    fi
    origin="$from/$name"
  else
    if ! curl -fsSL --retry 3 --max-time 120 -o "$tmp" "$url"; then
      echo "failed  $url (offline? use --from DIR with a copy of the traces)" >&2
      rm -f "$tmp"; status=1; continue
    fi
    origin="$url"
  fi
  got="$(sum_of "$tmp")"
  if [ "$got" != "$sum" ]; then
    echo "bad sum $origin: sha256 $got, expected $sum" >&2
    rm -f "$tmp"; status=1; continue
  fi
  mv "$tmp" "$target"
  echo "fetched $target from $origin"
done
exit $status
