# Sourced by scripts/container-smoke.sh and scripts/systemd-unit-smoke.sh (bash).
#
#   podman_probe IMAGE   # sets the arrays podman_global (e.g. --runtime runc) and
#                        # podman_run (e.g. --ulimit ...) under which a container of IMAGE
#                        # starts here; returns 1 with the last error in $podman_error
#                        # when none does.
#
# Some sandboxes refuse podman's default rlimits (above the host's hard limits) or crun's
# cgroup handling (hybrid cgroup v1/v2): try the defaults, then modest limits within the
# host's, then the runc runtime.
podman_probe() {
  local image=$1 hn hu
  _podman_min() { if [ "$1" = unlimited ] || [ "$1" -gt "$2" ]; then echo "$2"; else echo "$1"; fi; }
  hn=$(_podman_min "$(ulimit -Hn)" 16384)
  hu=$(_podman_min "$(ulimit -Hu)" 4096)
  podman_global=()
  podman_run=()
  _podman_try() { podman_error=$(podman "${podman_global[@]}" run --rm --network none "${podman_run[@]}" "$image" true 2>&1); }
  _podman_try && return 0
  podman_run=(--ulimit "nofile=$hn:$hn" --ulimit "nproc=$hu:$hu")
  _podman_try && return 0
  if command -v runc >/dev/null; then
    podman_global=(--runtime runc)
    _podman_try && return 0
  fi
  podman_error=$(printf '%s\n' "$podman_error" | grep -v '^\s*$' | tail -1)
  return 1
}
