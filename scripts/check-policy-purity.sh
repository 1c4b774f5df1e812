#!/usr/bin/env bash
# The policy core (src/policy: monitor, scaling, balancer, controller, placement, function
# pools, attempt protocol, timer table, core, cost, baselines — every file there) must stay
# sans-IO: no tokio, hyper, AWS SDK or metrics, no sockets, files or threads, no clock
# reads, and no import of the drivers or the I/O modules. Both drivers (live gateway,
# simulator) pass `now` in.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(find src/policy -name '*.rs' | sort)
bad=$(grep -nE '(^|[^a-z_])(tokio|hyper|hyper_util|aws_sdk_[a-z0-9]+|aws_config|metrics|reqwest|std::net|std::fs|std::thread|std::process)::|(^|[^a-z_])use (tokio|hyper|metrics)\b|(Instant|SystemTime)::now\(|crate::(proxy|backends|sim|net|telemetry|config|cli)\b' $files | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [ -n "$bad" ]; then
  echo "src/policy must stay sans-IO (no I/O crates, no clock reads, no driver imports):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "policy purity: ok ($(echo "$files" | wc -l) files: $(echo "$files" | xargs -n1 basename | tr '\n' ' '))"
