#!/usr/bin/env bash
# Check deploy/observability/ with promtool (Debian package `prometheus`):
#   * `promtool check rules spillway-rules.yaml` (syntax, PromQL, templates);
#   * `promtool test rules spillway-rules.test.yaml` (each alert fires on a gateway that
#     should alert, and not on one just under the threshold);
#   * every query of dashboard.json parses as PromQL (written into a temporary rule file
#     with Grafana's $__rate_interval and $instance filled in, then `promtool check rules`).
# That the dashboard and the rules use only metrics the gateway exports is the Rust test
# tests/observability.rs (against the real gateway's /metrics).
# Prints "observability check skipped: <reason>" and exits 0 without promtool or python3.
set -euo pipefail
cd "$(dirname "$0")/../deploy/observability"

skip() { echo "observability check skipped: $*"; exit 0; }
command -v promtool >/dev/null || skip "promtool is not installed (apt-get install prometheus)"
command -v python3 >/dev/null || skip "python3 is not installed (needed to read dashboard.json)"

echo "== promtool check rules spillway-rules.yaml"
promtool check rules spillway-rules.yaml
echo "== promtool test rules spillway-rules.test.yaml"
promtool test rules spillway-rules.test.yaml

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/dashboard-queries.yaml" <<'PY'
import json, sys
d = json.load(open("dashboard.json"))
exprs = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            exprs.append((p.get("title", "?"), t["expr"]))
walk(d["panels"])
for v in d.get("templating", {}).get("list", []):
    q = v.get("definition", "")
    if q.startswith("label_values("):
        # label_values(METRIC, LABEL) is Grafana's; check METRIC as a query.
        exprs.append((f"variable {v['name']}", q[len("label_values("):].rsplit(",", 1)[0]))
with open(sys.argv[1], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, e) in enumerate(exprs):
        e = e.replace("$__rate_interval", "5m").replace("$instance", ".*")
        f.write(f"      # dashboard.json panel: {title}\n")
        f.write(f"      - record: dashboard:query_{i}\n        expr: {json.dumps(e)}\n")
print(f"{len(exprs)} dashboard queries")
PY
echo "== promtool check rules (dashboard.json queries)"
promtool check rules "$tmp/dashboard-queries.yaml"
echo "observability files ok"
