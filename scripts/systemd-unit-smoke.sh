#!/usr/bin/env bash
# Run deploy/systemd/spillway.service for real: systemd as PID 1 of a podman container,
# the built binary at /usr/local/bin/spillway, the quickstart config at
# /etc/spillway/spillway.yaml (plus a drop-in TimeoutStopSec=5s, see below). Checks that the hardened unit starts (ExecStartPre check,
# DynamicUser, the system-call filter and the sample-API child processes included),
# that /healthz answers, that the gateway does not run as root, that `systemctl reload`
# leaves it serving, and that `systemctl stop` ends it with status 0.
#
#   scripts/systemd-unit-smoke.sh [BINARY]   # default: $CARGO_TARGET_DIR/debug/spillway
#
# Uses the base image scripts/container-smoke.sh makes (localhost/spillway-base:<codename>,
# or SPILLWAY_BASE_IMAGE) plus systemd and curl from apt, cached as
# localhost/spillway-systemd:<codename>. Prints "systemd unit run skipped: <reason>" and
# exits 0 when podman cannot run containers here or there is no base image.
set -euo pipefail
cd "$(dirname "$0")/.."

skip() { echo "systemd unit run skipped: $*"; exit 0; }
fail() { echo "systemd-unit-smoke: $*" >&2; exit 1; }

command -v podman >/dev/null || skip "podman is not installed (apt-get install podman)"
if ! info_err=$(podman info 2>&1 >/dev/null); then
  skip "\`podman info\` fails here: $(printf '%s\n' "$info_err" | grep -v '^\s*$' | tail -1)"
fi
codename=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true)
base="${SPILLWAY_BASE_IMAGE:-localhost/spillway-base:${codename:-none}}"
podman image exists "$base" || skip "no base image $base (scripts/container-smoke.sh makes it)"
. scripts/podman-probe.sh
podman_probe "$base" || skip "podman cannot start a container here: $podman_error"
pg=("${podman_global[@]}")
pr=("${podman_run[@]}")

target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/spillway}"
if [ ! -x "$bin" ]; then
  [ $# -eq 0 ] || fail "$bin is not an executable"
  echo "== cargo build --locked --bin spillway (for the unit run)"
  cargo build --locked --bin spillway
fi

image="localhost/spillway-systemd:${codename:-none}"
if ! podman image exists "$image"; then
  echo "== $image: $base + systemd, curl (apt-get in a container)"
  podman rm -f -t 0 spillway-systemd-build >/dev/null 2>&1 || true
  podman "${pg[@]}" run "${pr[@]}" --name spillway-systemd-build "$base" sh -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd systemd-sysv curl >/dev/null && rm -rf /var/lib/apt/lists/*' \
    >/dev/null 2>&1 \
    || { podman rm -f -t 0 spillway-systemd-build >/dev/null 2>&1 || true
         skip "cannot install systemd into $base (apt-get inside a container failed)"; }
  podman commit -q spillway-systemd-build "$image" >/dev/null
  podman rm spillway-systemd-build >/dev/null
fi

ctx=$(mktemp -d)
name="spillway-systemd-$$"
cleanup() { podman rm -f -t 0 "$name" >/dev/null 2>&1 || true; rm -rf "$ctx"; }
trap cleanup EXIT
cp "$bin" "$ctx/spillway"
cp deploy/systemd/spillway.service config/quickstart.yaml "$ctx/"
# The unit makes /etc read-only: the quickstart's asynchronous-call store goes to the
# unit's StateDirectory ($STATE_DIRECTORY, which spillway reads).
chmod -R a+rX "$ctx"

cx() { podman exec "$name" "$@"; }
journal() { cx journalctl -u spillway --no-pager 2>&1 | tail -30 >&2 || true; }
poll() { # poll SECONDS WHAT COMMAND...: until COMMAND succeeds
  local until=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $until ] || { journal; fail "$what: not within the deadline"; }
    sleep 0.5
  done
}

echo "== podman run --systemd=always $image"
podman "${pg[@]}" run -d "${pr[@]}" --systemd=always --name "$name" -v "$ctx:/ctx:ro" "$image" /sbin/init >/dev/null
poll 60 "systemd is up" sh -c "podman exec $name systemctl is-system-running | grep -Eq 'running|degraded'"
cx sh -c 'install -m 0755 /ctx/spillway /usr/local/bin/spillway &&
  install -D -m 0644 /ctx/quickstart.yaml /etc/spillway/spillway.yaml &&
  install -m 0644 /ctx/spillway.service /etc/systemd/system/spillway.service &&
  mkdir -p /etc/systemd/system/spillway.service.d &&
  printf "[Service]\nTimeoutStopSec=5s\n" >/etc/systemd/system/spillway.service.d/nested.conf &&
  systemctl daemon-reload'
echo "== systemctl start spillway"
cx systemctl start spillway || { journal; fail "systemctl start spillway failed"; }
poll 30 "/healthz answers ok" sh -c "podman exec $name curl -fsS 127.0.0.1:9901/healthz | grep -qx ok"
pid=$(cx systemctl show -p MainPID --value spillway)
uid=$(cx stat -c %u "/proc/$pid")
[ "$uid" != 0 ] || fail "the gateway runs as root under the unit"
cx curl -fsS -o /dev/null 127.0.0.1:8080/ || { journal; fail "GET / through the proxy failed"; }
echo "running as uid $uid (DynamicUser), /healthz ok, GET / ok"

# systemd nested in podman on a host with hybrid cgroups sometimes misses the
# cgroup-empty event after the main process exits (as it does on SIGHUP until config
# reload lands) and waits for TimeoutStopSec; the drop-in above shortens that wait to
# 5 s, and the reload counts as passed when the gateway serves again (restarted or
# reloaded in place).
echo "== systemctl reload spillway"
cx systemctl reload spillway || echo "(the reload job failed; waiting for the restart)"
# Serving and running, twice 1 s apart: a restart (RestartSec=2s) cannot hide in between.
serving() {
  [ "$(cx systemctl show -p SubState --value spillway)" = running ] \
    && cx curl -fsS 127.0.0.1:9901/healthz | grep -qx ok
}
poll 60 "serving again after the reload" sh -c "$(declare -f cx serving); name=$name; serving && sleep 1 && serving"
echo "serving after the reload (restarts: $(cx systemctl show -p NRestarts --value spillway))"

# The gateway's own exit, not the job's result (see the cgroup note above): after
# SIGTERM it logs "stopped" and exits with status 0 (a kill would leave the signal's
# number in ExecMainStatus).
echo "== systemctl stop spillway"
cx systemctl stop spillway || true
status=$(cx systemctl show -p ExecMainStatus --value spillway)
[ "$status" = 0 ] || { journal; fail "stop: the gateway ended with status $status, not 0"; }
cx journalctl -u spillway --no-pager -o cat | tail -5 | grep -q '"message":"stopped"' \
  || { journal; fail "stop: no \"stopped\" line from the gateway"; }
echo "systemd unit run passed: started, served, reloaded, stopped with status 0"
