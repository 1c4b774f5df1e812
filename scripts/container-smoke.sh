#!/usr/bin/env bash
# Build the container image (deploy/container/Containerfile) from the host-built binary and
# check that it serves: `/healthz` on the admin port answers `ok`, the proxy port answers
# a request (the embedded quickstart's sample API), the process is not root, the store
# directory is writable, and `podman stop` (SIGTERM) ends it with exit status 0.
#
#   scripts/container-smoke.sh [BINARY]   # default: $CARGO_TARGET_DIR/debug/spillway
#                                         # (built with `cargo build --locked` when missing)
#
# No image registry is needed: the base image is made from the Debian release and mirror
# that apt on this host already uses (`debootstrap --variant=minbase` + `podman import`),
# cached as localhost/spillway-base:<codename> (SPILLWAY_BASE_IMAGE=IMAGE uses another).
# When something needed is missing (podman, a working `podman info`, debootstrap, root,
# apt) it prints "container build skipped: <reason>" and exits 0; any failure after that
# point (build, start, /healthz) exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

skip() { echo "container build skipped: $*"; exit 0; }
fail() { echo "container-smoke: $*" >&2; exit 1; }

command -v podman >/dev/null || skip "podman is not installed (apt-get install podman)"
if ! info_err=$(podman info 2>&1 >/dev/null); then
  skip "\`podman info\` fails here: $(printf '%s\n' "$info_err" | grep -v '^\s*$' | tail -1)"
fi
command -v curl >/dev/null || skip "curl is not installed"

target="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target/debug/spillway}"
if [ ! -x "$bin" ]; then
  [ $# -eq 0 ] || fail "$bin is not an executable"
  echo "== cargo build --locked --bin spillway (for the image)"
  cargo build --locked --bin spillway
fi

# The base: a minimal root file system of the host's Debian release (the binary links
# against the host's glibc, so the base must be at least as new as the host).
base="${SPILLWAY_BASE_IMAGE:-}"
if [ -z "$base" ]; then
  [ -r /etc/os-release ] || skip "no /etc/os-release: cannot tell which Debian release to bootstrap"
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || skip "/etc/os-release names no VERSION_CODENAME"
  base="localhost/spillway-base:$codename"
  if ! podman image exists "$base"; then
    command -v debootstrap >/dev/null || skip "debootstrap is not installed (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || skip "debootstrap needs root (or set SPILLWAY_BASE_IMAGE)"
    command -v apt-get >/dev/null || skip "no apt-get: cannot tell which mirror apt uses"
    # The mirror apt already uses for this release (deb822 or one-line sources alike).
    mirror=$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null \
      | awk -v r="$codename" '$1 == r { print $2; exit }')
    [ -n "$mirror" ] || skip "apt has no source for the release $codename"
    rootfs=$(mktemp -d /var/tmp/spillway-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "== debootstrap --variant=minbase $codename from $mirror"
    debootstrap --variant=minbase "$codename" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
      || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; fail "debootstrap failed"; }
    rm -f "$rootfs.log"
    # Keep the image small: apt lists and caches are of no use in it.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    echo "== podman import -> $base"
    tar -C "$rootfs" --numeric-owner -c . | podman import - "$base" >/dev/null
    rm -rf "$rootfs"; trap - EXIT
  fi
fi

# Can this host run a container at all (scripts/podman-probe.sh)?
. scripts/podman-probe.sh
podman_probe "$base" || skip "podman cannot start a container here: $podman_error"
[ ${#podman_global[@]} -eq 0 ] && [ ${#podman_run[@]} -eq 0 ] \
  || echo "== containers run here with: podman ${podman_global[*]} ... ${podman_run[*]}"

image=localhost/spillway:smoke
ctx=$(mktemp -d)
name="spillway-smoke-$$"
cleanup() { podman rm -f -v -t 0 "$name" >/dev/null 2>&1 || true; rm -rf "$ctx"; }
trap cleanup EXIT
cp "$bin" "$ctx/spillway"
# The quickstart as a mounted config: on all interfaces (so the admin API needs a token,
# from the environment); its asynchronous-call store goes to the image's state directory
# (SPILLWAY_STATE_DIR=/var/lib/spillway, the volume).
mkdir -p "$ctx/etc"
sed -e 's/^  listen: 127.0.0.1:8080$/  listen: 0.0.0.0:8080/' \
    -e 's/^  admin_listen: 127.0.0.1:9901$/  admin_listen: 0.0.0.0:9901\n  admin_token_env: SPILLWAY_ADMIN_TOKEN/' \
    config/quickstart.yaml >"$ctx/etc/spillway.yaml"
chmod -R a+rX "$ctx/etc"
echo "== podman build --build-arg BASE=$base -f deploy/container/Containerfile"
podman "${podman_global[@]}" build -q "${podman_run[@]}" --build-arg "BASE=$base" -f deploy/container/Containerfile -t "$image" "$ctx" >/dev/null

# Published on loopback only, on ports podman picks; confined as the Kubernetes
# StatefulSet confines it (read-only root, no capabilities, no privilege escalation, a
# volume for the store and a tmpfs for /tmp).
echo "== podman run $image (admin and proxy published on 127.0.0.1, read-only, no capabilities)"
podman "${podman_global[@]}" run -d "${podman_run[@]}" --name "$name" \
  --read-only --cap-drop ALL --security-opt no-new-privileges \
  -v /var/lib/spillway --tmpfs /tmp \
  -v "$ctx/etc/spillway.yaml:/etc/spillway/spillway.yaml:ro" \
  -e SPILLWAY_ADMIN_TOKEN=ci-admin-token-0123456789abcdef \
  -p 127.0.0.1::9901 -p 127.0.0.1::8080 "$image" >/dev/null
admin=$(podman port "$name" 9901/tcp | head -1)
proxy=$(podman port "$name" 8080/tcp | head -1)
[ -n "$admin" ] && [ -n "$proxy" ] || fail "podman published no ports"

deadline=$((SECONDS + 60))
until body=$(curl -fsS --max-time 2 "http://$admin/healthz" 2>/dev/null) && [ "$body" = ok ]; do
  if [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
    podman logs "$name" 2>&1 | tail -20 >&2
    fail "the container exited before /healthz answered"
  fi
  if [ $SECONDS -ge $deadline ]; then
    podman logs "$name" 2>&1 | tail -20 >&2
    fail "/healthz on $admin did not answer ok within 60 s"
  fi
  sleep 0.5
done
echo "/healthz on $admin: $body"

uid=$(podman exec "$name" sh -c 'id -u' 2>/dev/null || podman inspect -f '{{.Config.User}}' "$name")
case "$uid" in 0 | 0:* | root*) fail "the gateway runs as root in the image (uid $uid)" ;; esac
echo "runs as uid $uid"
podman exec "$name" sh -c 'test -w /var/lib/spillway' \
  || fail "the state directory /var/lib/spillway is not writable by uid $uid"

status=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "http://$proxy/") || status=000
[ "$status" = 200 ] || { podman logs "$name" 2>&1 | tail -20 >&2; fail "GET / through the proxy on $proxy answered $status, not 200"; }
echo "GET / through the proxy on $proxy: $status"

# SIGTERM (podman stop) drains and exits 0, as PID 1 of the container.
podman stop -t 30 "$name" >/dev/null
code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { podman logs "$name" 2>&1 | tail -20 >&2; fail "after podman stop the gateway exited with $code, not 0"; }
echo "podman stop: exit status 0"
echo "container smoke test passed ($image on $base)"
