#!/usr/bin/env bash
# Where a request's CPU goes: user and system CPU µs and context switches (voluntary /
# involuntary) per request of the stock hyper reference proxy and spillway (and an
# earlier spillway binary, SPILLWAY_B), each under wrk -t1 -c64 for D seconds against an
# nginx origin on loopback, interleaved, two rounds. The same /proc method as
# scripts/bench-proxy.sh (run that first: it builds both binaries and installs nginx
# and wrk), split into user and sys, which that script sums.
#
# Usage: [SPILLWAY=bin] [SPILLWAY_B=bin] [HYPER_PROXY=bin] [D=5] scripts/cpu-split.sh
set -euo pipefail
cd "$(dirname "$0")/.."
S=${SPILLWAY:-${CARGO_TARGET_DIR:-target}/release/spillway}
SB=${SPILLWAY_B:-}
H=${HYPER_PROXY:-${CARGO_TARGET_DIR:-target}/release/examples/hyper_proxy}
D=${D:-5}
W=$(mktemp -d)
read -r ORIGIN SPW ADMIN HYP SPWB ADMINB < <(python3 -c '
import socket
ss=[socket.socket() for _ in range(6)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
cat >"$W/origin.conf" <<CONF
worker_processes 1; pid $W/origin.pid; error_log $W/origin.err; daemon on;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$ORIGIN; keepalive_requests 1000000;
    location / { return 200 "hello from origin\n"; } } }
CONF
. scripts/bench-common.sh
spillway_config $SPW $ADMIN $ORIGIN > "$W/s.yaml"; spillway_config $SPWB $ADMINB $ORIGIN > "$W/sb.yaml"
nginx -c "$W/origin.conf" -p "$W" -e "$W/origin.err"
PIDS=()
"$S" serve --config "$W/s.yaml" >"$W/s.log" 2>&1 & SP=$!; PIDS+=($SP)
"$H" "127.0.0.1:$HYP" "http://127.0.0.1:$ORIGIN" >"$W/h.log" 2>&1 & HP=$!; PIDS+=($HP)
BP=
if [ -n "$SB" ]; then "$SB" serve --config "$W/sb.yaml" >"$W/sb.log" 2>&1 & BP=$!; PIDS+=($BP); fi
trap 'kill ${PIDS[*]} 2>/dev/null; nginx -c "$W/origin.conf" -p "$W" -e "$W/origin.err" -s stop; rm -rf $W' EXIT
for p in $SPW $HYP ${BP:+$SPWB}; do for _ in $(seq 100); do curl -sf "http://127.0.0.1:$p/" >/dev/null && break; sleep 0.1; done; done
snap() { # pid -> "voluntary involuntary user_ticks sys_ticks"
  local v=0 n=0 t
  for f in /proc/$1/task/*/status; do
    v=$((v + $(awk '/^voluntary_ctxt/{print $2}' $f))); n=$((n + $(awk '/^nonvoluntary_ctxt/{print $2}' $f)))
  done
  t=$(sed 's/.*) //' /proc/$1/stat | awk '{print $12 " " $13}')
  echo "$v $n $t"
}
run() { # name pid port
  read -r v0 n0 u0 s0 < <(snap $2)
  out=$(timeout $((D+10)) wrk -t1 -c64 -d${D}s "http://127.0.0.1:$3/")
  read -r v1 n1 u1 s1 < <(snap $2)
  reqs=$(echo "$out" | awk '/requests in/{print $1}')
  awk -v n="$1" -v r=$reqs -v v=$((v1-v0)) -v i=$((n1-n0)) -v u=$((u1-u0)) -v s=$((s1-s0)) -v hz=$(getconf CLK_TCK) 'BEGIN{printf "%-10s req=%d vol/req=%.3f invol/req=%.3f cpu_us/req=%.2f user=%.2f sys=%.2f\n", n, r, v/r, i/r, (u+s)*1e6/hz/r, u*1e6/hz/r, s*1e6/hz/r}'
}
for round in 1 2; do
  run hyper $HP $HYP
  run spillway $SP $SPW
  [ -n "$BP" ] && run before $BP $SPWB
done
