# Sourced by scripts/bench-proxy.sh and scripts/cpu-split.sh: the configuration both
# measure spillway with.
#
# spillway: one static VM (the origin), LIBRA routing on with room for all the traffic on
# the VM (no spill), metrics on (always), header hygiene on (always), access log off.
# Usage: spillway_config LISTEN_PORT ADMIN_PORT ORIGIN_PORT > file.yaml
spillway_config() {
cat <<CONF
version: 1
gateway:
  listen: 127.0.0.1:$1
  admin_listen: 127.0.0.1:$2
  access_log: false
  allow_loopback_upstreams: true
libra:
  decision_epochs: 100000
  r_max_rps: 100000000
  min_vms: 1
  max_vms: 1
vm_pool:
  type: static
  urls: ["http://127.0.0.1:$3"]
function_tier:
  type: http
  url: http://127.0.0.1:$3/
  max_concurrency: 64
CONF
}
