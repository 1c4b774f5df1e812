#!/usr/bin/env bash
# The policy core (src/policy) must stay sans-IO: no tokio, hyper, AWS SDK or metrics,
# and no clock reads. Both drivers (live gateway, simulator) pass `now` in.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(grep -rnE '(^|[^a-z_])(tokio|hyper|hyper_util|aws_sdk_[a-z0-9]+|aws_config|metrics|reqwest|std::net|std::fs|std::thread)::|(Instant|SystemTime)::now\(' src/policy || true)
if [ -n "$bad" ]; then
  echo "src/policy must stay sans-IO (no I/O crates, no clock reads):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "policy purity: ok"
