#!/usr/bin/env bash
# Side-by-side proxy benchmark on loopback: an nginx origin answered directly,
# through nginx, through HAProxy, through a stock hyper reference proxy
# (examples/hyper_proxy.rs: hyper 1 + hyper-util's pooled client, one current-thread
# runtime per core, no routing or metrics: the limit of the stack spillway is built on)
# and through spillway (a `static` pool of that origin, LIBRA routing, metrics and
# header hygiene on, access log off). Prints markdown tables:
#   * wrk -t1 -c64 -d10s keep-alive, three rounds (req/s, p50, p99, spillway / nginx,
#     and each proxy's CPU µs per request: the user+sys time of its processes, read
#     from /proc before and after the run, divided by the requests wrk completed — on a
#     shared machine far steadier than req/s);
#   * one connection, wrk -t1 -c1 -d10s --latency (p50, p99, p50 added over direct);
#   * h2: h2load h2c prior knowledge, 4 connections x 16 streams, 10 s (CPU µs per
#     request too).
# Installs nginx, haproxy, wrk and nghttp2-client (h2load) with apt-get when missing.
# Everything listens on 127.0.0.1 (free ports); every client run is bounded by `timeout`;
# every process started here is stopped on exit.
#
# Usage: scripts/bench-proxy.sh [seconds] [connections]
#   SPILLWAY=path/to/spillway   binary to measure (default: the release build under
#                               ${CARGO_TARGET_DIR:-target}, built when missing)
#   HYPER_PROXY=path            the reference proxy (default: the release build of
#                               examples/hyper_proxy.rs there, built when missing)
#   ROUNDS=3                    rounds of the 64-connection table
#   SPILLWAY_BEFORE=path        an earlier spillway binary, measured as the row "before"
#                               right before "spillway" in every table and round (old and
#                               new side by side in one interleaved run; same config)
set -euo pipefail
D=${1:-10}
C=${2:-64}
ROUNDS=${ROUNDS:-3}
cd "$(dirname "$0")/.."

need=()
command -v nginx >/dev/null || need+=(nginx)
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
command -v h2load >/dev/null || need+=(nghttp2-client)
if ((${#need[@]})); then
  echo "installing ${need[*]}" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >&2
fi

SPILLWAY=${SPILLWAY:-${CARGO_TARGET_DIR:-target}/release/spillway}
if [ ! -x "$SPILLWAY" ]; then
  echo "building $SPILLWAY" >&2
  cargo build --release --bin spillway >&2
fi
HYPER_PROXY=${HYPER_PROXY:-${CARGO_TARGET_DIR:-target}/release/examples/hyper_proxy}
if [ ! -x "$HYPER_PROXY" ]; then
  echo "building $HYPER_PROXY" >&2
  cargo build --release --example hyper_proxy >&2
fi

W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$W/haproxy.pid" ] && kill "$(cat "$W/haproxy.pid")" 2>/dev/null
  for c in origin nginx; do
    [ -f "$W/$c.pid" ] && nginx -c "$W/$c.conf" -p "$W" -e "$W/$c.err" -s stop 2>/dev/null
  done
  sleep 0.3
  rm -rf "$W"
}
trap cleanup EXIT

# Free loopback ports (the kernel picks them; nothing else on the box is disturbed).
read -r ORIGIN ORIGIN_H2 NGX NGX_H2 HAP HAP_H2 SPW ADMIN HYP SPWB ADMINB < <(python3 - <<'PY'
import socket
ss = [socket.socket() for _ in range(11)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss:
    s.close()
PY
)

cat >"$W/origin.conf" <<CONF
worker_processes 1; pid $W/origin.pid; error_log $W/origin.err; daemon on;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$ORIGIN; keepalive_requests 1000000;
    location / { return 200 "hello from origin\n"; } }
  server { listen 127.0.0.1:$ORIGIN_H2 http2; keepalive_requests 1000000;
    location / { return 200 "hello from origin\n"; } } }
CONF
cat >"$W/nginx.conf" <<CONF
worker_processes auto; pid $W/nginx.pid; error_log $W/nginx.err; daemon on;
events { worker_connections 4096; }
http { access_log off; upstream o { server 127.0.0.1:$ORIGIN; keepalive 128; }
  server { listen 127.0.0.1:$NGX; listen 127.0.0.1:$NGX_H2 http2; keepalive_requests 1000000;
    location / { proxy_pass http://o; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
cat >"$W/haproxy.cfg" <<CONF
global
  nbthread 2
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend f
  bind 127.0.0.1:$HAP
  bind 127.0.0.1:$HAP_H2 proto h2
  default_backend b
backend b
  http-reuse always
  server o 127.0.0.1:$ORIGIN
CONF
. scripts/bench-common.sh
spillway_config "$SPW" "$ADMIN" "$ORIGIN" >"$W/spillway.yaml"
spillway_config "$SPWB" "$ADMINB" "$ORIGIN" >"$W/before.yaml"

nginx -c "$W/origin.conf" -p "$W" -e "$W/origin.err"
nginx -c "$W/nginx.conf" -p "$W" -e "$W/nginx.err"
haproxy -D -f "$W/haproxy.cfg" -p "$W/haproxy.pid"
"$SPILLWAY" serve --config "$W/spillway.yaml" >"$W/spillway.log" 2>&1 &
SPID=$!
PIDS+=("$SPID")
BPID=
BEFORE=()
if [ -n "${SPILLWAY_BEFORE:-}" ]; then
  "$SPILLWAY_BEFORE" serve --config "$W/before.yaml" >"$W/before.log" 2>&1 &
  BPID=$!
  PIDS+=("$BPID")
  BEFORE=("before:$SPWB")
fi
# The reference proxy: HTTP/1.1 and h2c on one port.
"$HYPER_PROXY" "127.0.0.1:$HYP" "http://127.0.0.1:$ORIGIN" >"$W/hyper.log" 2>&1 &
HPID=$!
PIDS+=("$HPID")
for port in $ORIGIN $NGX $HAP $HYP $SPW ${BPID:+$SPWB}; do
  for _ in $(seq 100); do
    curl -fs -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
  curl -fs -o /dev/null "http://127.0.0.1:$port/" || { echo "nothing answers on $port" >&2; cat "$W/spillway.log" >&2; exit 1; }
done

# wrk latency ("812.00us", "1.23ms", "1.01s") in microseconds.
us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print "nan" }'; }
# run NAME PORT CONNS -> "rps p50 p99 cpu_us_per_request errors"
run() {
  local out rps p50 p99 err n before after
  before=$(cpu_ticks "$1")
  out=$(timeout $((D + 30)) wrk -t1 -c"$3" -d"${D}s" --latency "http://127.0.0.1:$2/" 2>&1) || true
  after=$(cpu_ticks "$1")
  n=$(awk '/requests in/{print $1}' <<<"$out")
  rps=$(awk '/Requests\/sec/{print $2}' <<<"$out")
  p50=$(awk '$1=="50%"{print $2}' <<<"$out")
  p99=$(awk '$1=="99%"{print $2}' <<<"$out")
  err=$(grep -E "Non-2xx|Socket errors" <<<"$out" | tr -s ' \n' ' ' || true)
  echo "${rps:-0} ${p50:-nan} ${p99:-nan} $(cpu_us "$before" "$after" "${n:-0}") ${err:--}"
}
# cpu_ticks NAME: user+sys clock ticks of the proxy NAME's processes (a master and its
# children); "-" for direct (no proxy).
HZ=$(getconf CLK_TCK)
cpu_ticks() {
  local root
  case $1 in
    nginx) root=$(cat "$W/nginx.pid") ;;
    haproxy) root=$(cat "$W/haproxy.pid") ;;
    spillway) root=$SPID ;;
    before) root=$BPID ;;
    hyper) root=$HPID ;;
    *) echo -; return ;;
  esac
  local t=0 p
  for p in $root $(pgrep -P "$root" || true); do
    [ -r "/proc/$p/stat" ] || continue
    # Fields after the command name's closing parenthesis: utime is the 12th, stime the 13th.
    t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}
# cpu_us BEFORE AFTER REQUESTS: CPU µs per request ("-" without a proxy or requests).
cpu_us() { awk -v a="$1" -v b="$2" -v n="$3" -v hz="$HZ" 'BEGIN { if (a == "-" || n + 0 <= 0) print "-"; else printf "%.1f", (b - a) * 1000000 / hz / n }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

echo "## bench-proxy.sh — $(date -u '+%Y-%m-%d %H:%M UTC')"
echo
echo "machine: $(nproc) cores, $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), $(uname -r); nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), HAProxy $(haproxy -v | awk 'NR==1{print $3}'); hyper $(awk '/^name = "hyper"$/{getline; gsub(/"/, "", $3); print $3; exit}' Cargo.lock), $("$SPILLWAY" --version 2>/dev/null | head -1) (tree $(git rev-parse --short HEAD 2>/dev/null || echo -))"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "### wrk -t1 -c$C -d${D}s, keep-alive"
echo
echo "| round | target | req/s | p50 | p99 | × nginx req/s | CPU µs/request | × nginx CPU | errors |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  declare -A RPS=() CPU=()
  for t in direct:$ORIGIN nginx:$NGX haproxy:$HAP hyper:$HYP "${BEFORE[@]}" spillway:$SPW; do
    name=${t%%:*}
    read -r rps p50 p99 cpu err <<<"$(run "$name" "${t#*:}" "$C")"
    RPS[$name]=$rps
    CPU[$name]=$cpu
    cpu_ratio=-
    [ "$cpu" != - ] && [ "${CPU[nginx]:--}" != - ] && cpu_ratio=$(ratio "$cpu" "${CPU[nginx]}")
    echo "| $round | $name | $rps | $p50 | $p99 | $(ratio "$rps" "${RPS[nginx]:-0}") | $cpu | $cpu_ratio | $err |"
  done
done
echo
echo "### one connection: wrk -t1 -c1 -d${D}s --latency"
echo
echo "| target | req/s | p50 | p99 | p50 − direct p50 |"
echo "|---|---|---|---|---|"
direct_p50=
for t in direct:$ORIGIN nginx:$NGX haproxy:$HAP hyper:$HYP "${BEFORE[@]}" spillway:$SPW; do
  name=${t%%:*}
  read -r rps p50 p99 _ _ <<<"$(run "$name" "${t#*:}" 1)"
  [ -z "$direct_p50" ] && direct_p50=$(us "$p50")
  added=$(awk -v a="$(us "$p50")" -v b="$direct_p50" 'BEGIN { printf "%.0f µs", a - b }')
  echo "| $name | $rps | $p50 | $p99 | $added |"
done
echo
echo "### h2: h2load h2c prior knowledge, 4 connections × 16 streams, ${D}s"
echo
echo "| target | req/s | mean request time | × nginx req/s | CPU µs/request | failed |"
echo "|---|---|---|---|---|---|"
nginx_h2=0
for t in direct:$ORIGIN_H2 nginx:$NGX_H2 haproxy:$HAP_H2 hyper:$HYP "${BEFORE[@]}" spillway:$SPW; do
  name=${t%%:*}
  before=$(cpu_ticks "$name")
  out=$(timeout $((D + 30)) h2load -t1 -c4 -m16 -D "$D" "http://127.0.0.1:${t#*:}/" 2>&1) || true
  after=$(cpu_ticks "$name")
  done_n=$(awk '/^requests:/{for (i = 1; i <= NF; i++) if ($(i+1) ~ /^succeeded/) print $i}' <<<"$out")
  rps=$(awk '/^finished in/{gsub(",", ""); print $4}' <<<"$out")
  mean=$(awk '$1=="time" && $3=="request:"{print $6}' <<<"$out")
  failed=$(awk '/^requests:/{for (i = 1; i <= NF; i++) if ($(i+1) ~ /^failed/) print $i}' <<<"$out")
  [ "$name" = nginx ] && nginx_h2=${rps:-0}
  echo "| $name | ${rps:-0} | ${mean:--} | $(ratio "${rps:-0}" "$nginx_h2") | $(cpu_us "$before" "$after" "${done_n:-0}") | ${failed:--} |"
done
echo
echo "spillway RSS after the runs: $(awk '/VmRSS/{printf "%.1f MiB", $2 / 1024}' /proc/$SPID/status)"
[ -n "$BPID" ] && echo "before ($SPILLWAY_BEFORE) RSS after the runs: $(awk '/VmRSS/{printf "%.1f MiB", $2 / 1024}' /proc/$BPID/status)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
