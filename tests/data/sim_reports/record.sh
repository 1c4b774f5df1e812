#!/bin/sh
# Record the reports of cases.txt with the spillway binary $1 into before/ (run once,
# with the code before the change; see cases.txt). The third column of a case is not
# passed: it is for the binary under test.
set -eu
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp "$here"/*.txt "$here/../sim_counts.txt" "$here/../sim_events.txt" \
   "$here/../sim_azure2021.csv" "$here/../faasim/burst_excerpt.txt" "$scratch"
rm -f "$scratch/cases.txt"
rm -rf "$here/before"
mkdir -p "$here/before"
set -f
grep -v '^#' "$here/cases.txt" | grep -v '^$' | while IFS='|' read -r name args _new; do
    name=$(echo "$name" | tr -d ' ')
    args=$(echo "$args" | sed "s#{root}#$root#g")
    out="$here/before/$name"
    mkdir -p "$out"
    ls "$scratch" > "$scratch/.before"
    # shellcheck disable=SC2086 # the arguments are split at spaces on purpose
    (cd "$scratch" && "$bin" $args > "$out/stdout" 2> /dev/null)
    ls "$scratch" | grep -vxF -f "$scratch/.before" | while read -r f; do
        [ "$f" = .before ] || cp "$scratch/$f" "$out/$f"
    done
done
du -sh "$here/before"
