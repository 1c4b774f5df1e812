#!/usr/bin/env bash
# Run every example of README.md and of the manual's pages (docs/src/**/*.md), on 127.0.0.1
# only, each bounded in time.
#
#   scripts/readme-examples.sh            # all of them (about 6 minutes after the build)
#   scripts/readme-examples.sh --short    # without the two real-time load-test replays
#   scripts/readme-examples.sh --page docs/src/sim/logs.md   # one page's console and
#                                         # YAML examples only (repeatable)
#
# * `cargo run --release [-p spillway-loadtest] --` in an example is the release binary
#   built here (`cargo build --release --locked`), `spillway` is target/release/spillway.
# * The gateway examples use free ports (`--listen localhost:0 --admin-listen
#   127.0.0.1:0`, the README's documented override) instead of 8080/9901: the README's
#   quickstart and square wave (section 2), the WITS replay of docs/src/guide/load-test.md
#   (section 3), the command line of docs/src/guide/admin.md and guide/aws.md (section 4).
# * Every ```console block of README.md and docs/src/**/*.md is run and its output compared
#   with the page: stdout (or stderr when stdout is empty) must equal the lines shown, a
#   `...` line standing for any number of lines. They run in a scratch directory holding
#   a link to every top-level entry of the repository (files they write stay there); a
#   command that only sets a shell variable (`M="..."`) is set again before the page's
#   later commands. With the traces there, the scratch directory starts with the manual's
#   example nginx log, access.log (scripts/counts-to-nginx-log.py on the first hour of
#   WITS), so that a page using it does not depend on another page having made it.
# * Every ```yaml block is a config fragment: put over the quickstart, it must pass
#   `spillway check` (section 1b).
# * Examples that replay traces/wits_per_second.txt or traces/square_per_second.txt are
#   skipped, with the reason, when scripts/fetch-traces.sh has not put them there; the
#   AWS `check` example when no binary with the `aws` feature was built.
# * Not run: the benchmark and cold-build commands of "Measured numbers" (measurements,
#   not examples; docs/src/results/), and `.ci/run` on a fresh clone (it runs this script).
# Exit status: 0 when every example that ran passed.
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true
short=0
pages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short=1 ;;
    --page)
      [ $# -ge 2 ] && [ -f "$2" ] || { echo "--page needs a Markdown file, got ${2:-nothing}" >&2; exit 2; }
      pages+=("$2"); shift ;;
    *) echo "unknown option $1 (--short, --page FILE)" >&2; exit 2 ;;
  esac
  shift
done

started=$SECONDS
target="${CARGO_TARGET_DIR:-target}"
echo "== building the release binaries (cargo build --release --locked)"
cargo build --release --locked -p spillway -p spillway-loadtest
SPILLWAY="$(cd "$target/release" && pwd)/spillway"
LOADTEST="$(cd "$target/release" && pwd)/spillway-loadtest"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
  rm -f r.json
}
trap cleanup EXIT

passed=0; failed=0; skipped=0
pass() { echo "ok      $1"; passed=$((passed + 1)); }
fail() { echo "FAILED  $1"; failed=$((failed + 1)); }
skip() { echo "skipped $1"; skipped=$((skipped + 1)); }
have_traces() { [ -f traces/wits_per_second.txt ] && [ -f traces/square_per_second.txt ]; }
no_traces="traces/ lacks WITS and square (run scripts/fetch-traces.sh)"

# --- 1. console examples: run, compare the output -----------------------------------
echo "== console examples"
scratch="$work/console-cwd"
mkdir -p "$scratch"
for entry in * .[!.]*; do
  [ -e "$entry" ] && [ "$entry" != .git ] && ln -s "$PWD/$entry" "$scratch/$entry"
done
if [ -f traces/wits_per_second.txt ]; then
  python3 scripts/counts-to-nginx-log.py traces/wits_per_second.txt 3600 1 >"$scratch/access.log"
fi
python3 - "$SPILLWAY" "$LOADTEST" "$scratch" "${pages[@]}" >"$work/console.txt" <<'PY' || true
import os, re, subprocess, sys
spillway, loadtest, scratch = sys.argv[1:4]
pages = sys.argv[4:] or ["README.md"] + sorted(
    os.path.join(d, f) for d, _, fs in os.walk("docs/src") for f in fs if f.endswith(".md"))
blocks = []
for page in pages:
    text = open(page, encoding="utf-8").read()
    blocks += [(page, b) for b in re.findall(r"```console\n(.*?)```", text, re.S)]
have_traces = os.path.exists("traces/wits_per_second.txt") and os.path.exists("traces/square_per_second.txt")
failures = 0
variables = {}  # page -> the commands of the page that only set a shell variable
for page, block in blocks:
    lines = block.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        cmd = lines[i][2:]
        while cmd.endswith("\\"):
            i += 1
            cmd = cmd[:-1] + " " + lines[i].strip()
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        shown = f"{cmd}  ({page})"
        if ("traces/" in cmd or "access.log" in cmd) and not have_traces:
            print(f"skipped $ {shown}  (traces/ lacks WITS and square: run scripts/fetch-traces.sh)")
            continue
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=(\"[^\"]*\"|'[^']*'|\S*)", cmd) and not expected:
            variables.setdefault(page, []).append(cmd)
            print(f"ok      $ {shown}")
            continue
        cmd = re.sub(r"^cargo run --release -p spillway-loadtest --", loadtest, cmd)
        cmd = re.sub(r"^cargo run --release --", spillway, cmd)
        cmd = re.sub(r"^spillway\b", spillway, cmd)
        try:
            prelude = "".join(v + "; " for v in variables.get(page, []))
            out = subprocess.run(["bash", "-c", prelude + cmd], capture_output=True, text=True,
                                 timeout=180, cwd=scratch)
        except subprocess.TimeoutExpired:
            print(f"FAILED  $ {shown}  (no end within 180 s)")
            failures += 1
            continue
        text = (out.stdout or out.stderr).rstrip("\n")
        actual = text.split("\n") if text else []
        # Match `expected` against `actual`, `...` = any number of lines.
        def match(e, a):
            if not e:
                return not a
            if e[0].strip() == "...":
                return any(match(e[1:], a[k:]) for k in range(len(a) + 1))
            return bool(a) and e[0].rstrip() == a[0].rstrip() and match(e[1:], a[1:])
        if match(expected, actual):
            print(f"ok      $ {shown}")
        else:
            failures += 1
            print(f"FAILED  $ {shown}\n--- the page shows\n" + "\n".join(expected)
                  + "\n--- actual\n" + "\n".join(actual))
sys.exit(1 if failures else 0)
PY
cat "$work/console.txt"
passed=$((passed + $(grep -c '^ok ' "$work/console.txt" || true)))
failed=$((failed + $(grep -c '^FAILED ' "$work/console.txt" || true)))
skipped=$((skipped + $(grep -c '^skipped ' "$work/console.txt" || true)))

# --- 1b. YAML examples: every ```yaml block passes `spillway check` ------------------
# A block is a fragment of a config: its top-level sections replace the quickstart's
# (config/quickstart.yaml; `function_zones` also replaces `function_tier`, whose one zone
# would be a second cloud zone), and the whole must pass `spillway check` as `serve`
# would read it. Files a block names under /etc/spillway/ (TLS certificates and keys) are
# made here with openssl — a self-signed CA and a client certificate and key — and the
# paths point at them. A block whose first line is `# not a spillway config` is skipped;
# a block refused only because this binary lacks the `otlp` feature passes.
echo "== YAML examples (spillway check)"
python3 - "$SPILLWAY" "$work" "${pages[@]}" >"$work/yaml.txt" <<'PY' || true
import os, re, subprocess, sys
spillway, work = sys.argv[1:3]
pages = sys.argv[3:] or ["README.md"] + sorted(
    os.path.join(d, f) for d, _, fs in os.walk("docs/src") for f in fs if f.endswith(".md"))

def sections(text):
    """Top-level `key:` sections of a block YAML text, in order: [(key, text)]."""
    out, key, lines = [], None, []
    for line in text.split("\n"):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):", line)
        if m:
            if key is not None or lines:
                out.append((key, "\n".join(lines)))
            key, lines = m.group(1), [line]
        else:
            lines.append(line)
    out.append((key, "\n".join(lines)))
    return out

base = sections(open("config/quickstart.yaml", encoding="utf-8").read())
etc = os.path.join(work, "etc-spillway")
os.makedirs(etc, exist_ok=True)
def self_signed(cert, key, cn):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", f"/CN={cn}",
                    "-keyout", os.path.join(etc, key), "-out", os.path.join(etc, cert)],
                   capture_output=True, check=False)
self_signed("upstream-ca.pem", "upstream-ca.key", "spillway examples CA")
self_signed("gateway.crt", "gateway.key", "spillway gateway")
def local_files(yaml):
    return re.sub(r"/etc/spillway/([A-Za-z0-9._-]+)",
                  lambda m: os.path.join(etc, m.group(1)) if os.path.exists(os.path.join(etc, m.group(1)))
                  else m.group(0), yaml)
n = 0
for page in pages:
    text = open(page, encoding="utf-8").read()
    for m in re.finditer(r"```yaml\n(.*?)```", text, re.S):
        block = m.group(1)
        line = text.count("\n", 0, m.start()) + 2
        where = f"{page}:{line}"
        if block.startswith("# not a spillway config"):
            print(f"skipped yaml {where} (not a spillway config)")
            continue
        frag = sections(block)
        keys = {k for k, _ in frag if k}
        drop = set(keys) | ({"function_tier"} if "function_zones" in keys else set())
        merged = "\n".join(s for k, s in base if k not in drop) + "\n" + local_files(block)
        n += 1
        path = os.path.join(work, f"example-{n}.yaml")
        open(path, "w", encoding="utf-8").write(merged)
        out = subprocess.run([spillway, "check", path], capture_output=True, text=True, timeout=60)
        issues = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
        if out.returncode == 0:
            print(f"ok      yaml {where}")
        elif issues and all("without the `otlp` feature" in l for l in issues):
            # The release binary here is built without features: `telemetry.otlp` is
            # refused for that alone, with its own message.
            print(f"ok      yaml {where} (telemetry.otlp: needs the otlp feature)")
        else:
            print(f"FAILED  yaml {where}: spillway check of the block on the quickstart ({path}):\n"
                  + (out.stdout + out.stderr).rstrip())
PY
cat "$work/yaml.txt"
passed=$((passed + $(grep -c '^ok ' "$work/yaml.txt" || true)))
failed=$((failed + $(grep -c '^FAILED ' "$work/yaml.txt" || true)))
skipped=$((skipped + $(grep -c '^skipped ' "$work/yaml.txt" || true)))
if [ ${#pages[@]} -gt 0 ]; then
  echo "== examples of ${pages[*]}: $passed passed, $failed failed, $skipped skipped in $((SECONDS - started)) s"
  [ $failed = 0 ]
  exit
fi

# --- 2. the quickstart: serve, curl, (square wave), shut down ----------------------------
# Start the quickstart with --listen/--admin-listen on free ports; sets PROXY, ADMIN, LOG.
start_quickstart() {
  LOG="$work/serve-$1.log"
  shift
  # Each run its own state directory (the quickstart's asynchronous-call store).
  "$SPILLWAY" serve --listen localhost:0 --admin-listen 127.0.0.1:0 \
    --state-dir "$work/state-$(basename "$LOG" .log)" "$@" 2>"$LOG" &
  GATEWAY_PID=$!
  pids+=("$GATEWAY_PID")
  local deadline=$((SECONDS + 60))
  until grep -q "spillway listening" "$LOG"; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
      echo "the gateway did not start:"; cat "$LOG"; return 1
    fi
    sleep 0.1
  done
  PROXY="$(grep -o 'proxy=[0-9.:]*' "$LOG" | head -1 | cut -d= -f2)"
  ADMIN="$(grep -o 'admin=[0-9.:]*' "$LOG" | head -1 | cut -d= -f2)"
}

# Poll until `$1` (a command) succeeds, at most $2 seconds.
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1
  done
}

# first_lines_have N TEXT STRING: TEXT occurs in the first N lines of STRING (one
# process reads all of it: no early exit to break a pipe under pipefail).
first_lines_have() {
  awk -v n="$1" -v t="$2" 'NR <= n && index($0, t) { found = 1 } END { exit !found }' <<<"$3"
}

stop_gateway() {
  kill -TERM "$GATEWAY_PID"
  local code=0
  timeout 30 tail --pid="$GATEWAY_PID" -f /dev/null || code=$?
  wait "$GATEWAY_PID" 2>/dev/null || code=$?
  [ "$code" = 0 ]
}

echo "== quickstart (cargo run --release -- serve, --access-log)"
if start_quickstart quickstart --access-log; then
  pass "serve: spillway listening proxy=$PROXY admin=$ADMIN"
  wait_for "curl -sf http://$ADMIN/status | grep -q '\"ready_vms\": 1'" 30 || true
  headers="$(curl -si "http://$PROXY/")"
  if grep -q "^HTTP/1.1 200" <<<"$headers" && grep -qi "^x-spillway-instance: vm-" <<<"$headers"; then
    pass "curl -i 127.0.0.1:8080/  (200 from a VM: $(grep -i '^x-spillway-instance' <<<"$headers" | tr -d '\r'))"
  else
    fail "curl -i 127.0.0.1:8080/  (expected 200 from vm-…):"$'\n'"$headers"
  fi
  # One read into a variable, then one awk over its first lines: `curl | head | grep -q`
  # under pipefail fails whenever grep or head exits before the writer is done (SIGPIPE;
  # curl: write error), which a longer /status made likely in a CI run.
  if first_lines_have 40 '"routed"' "$(curl -s "http://$ADMIN/status")"; then
    pass "curl -s 127.0.0.1:9901/status | head -40"
  else
    fail "curl -s 127.0.0.1:9901/status | head -40"
  fi
  # Polled (at most 10 s), not read once: in a fresh-clone CI run under load one
  # single read missed it although the request had been served by the VM.
  if wait_for "curl -s http://$ADMIN/metrics | grep -q '^spillway_requests_total{tier=\"vm\",status=\"2xx\"} 1'" 10; then
    pass "curl -s 127.0.0.1:9901/metrics | grep '^spillway_'"
  else
    fail "curl -s 127.0.0.1:9901/metrics | grep '^spillway_' (expected vm 2xx = 1):"$'\n'"$(curl -s "http://$ADMIN/metrics" | grep '^spillway_requests_total')"
  fi
  if wait_for "grep -q 'spillway::access: request .*status=200 tier=vm' '$LOG'" 10; then
    pass "serve --access-log: one access line per request"
  else
    fail "serve --access-log: no access line in"$'\n'"$(cat "$LOG")"
  fi
  if [ $short = 1 ]; then
    skip "the square-wave replay (--short)"
  elif ! have_traces; then
    skip "the square-wave replay ($no_traces)"
  else
    echo "   the square wave: 120 s in real time"
    if timeout 200 "$LOADTEST" --trace traces/square_per_second.txt \
        --url "http://$PROXY/sleep?ms=20" --admin "http://$ADMIN" \
        --interval-seconds 10 --to 120 --json "$work/square.json" >"$work/square.txt" 2>&1 &&
      python3 - "$work/square.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["total"]
assert t["errors"] == 0, t
assert t["vm_share"] > 0 and t["function_share"] > 0, t
PY
    then
      pass "the square-wave replay (both tiers, no error):"$'\n'"$(cat "$work/square.txt")"
    else
      fail "the square-wave replay:"$'\n'"$(cat "$work/square.txt")"
    fi
  fi
  if first_lines_have 30 '"scaling"' "$(curl -s "http://$ADMIN/status")"; then
    pass "watch -n1 'curl -s 127.0.0.1:9901/status | head -30' (one round)"
  else
    fail "curl -s 127.0.0.1:9901/status | head -30"
  fi
  if stop_gateway; then pass "Ctrl-C/SIGTERM: the gateway exits 0"; else fail "SIGTERM: exit status"; fi
else
  fail "serve (the quickstart did not start)"
fi

# --- 3. the LIBRA AWS experiment shape against the quickstart ------------------------
echo "== load test: WITS 1,800 s ÷16, 10x faster"
if [ $short = 1 ]; then
  skip "the WITS replay (--short)"
elif ! have_traces; then
  skip "the WITS replay ($no_traces)"
elif start_quickstart wits; then
  echo "   3 minutes in real time"
  if timeout 300 "$LOADTEST" --trace traces/wits_per_second.txt \
      --url "http://$PROXY/sleep?ms=50" --admin "http://$ADMIN" \
      --to 1800 --rate-divisor 16 --time-compression 10 --json "$work/wits.json" \
      >"$work/wits.txt" 2>"$work/wits.err" &&
    python3 - "$work/wits.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["total"]
assert t["requests"] == 21073, t
assert t["errors"] == 0, t
assert t["vm_share"] > 0 and t["function_share"] > 0, t
PY
  then
    pass "the WITS replay (21,073 requests, no error, both tiers):"$'\n'"$(tail -2 "$work/wits.txt")"
  else
    fail "the WITS replay:"$'\n'"$(cat "$work/wits.txt" "$work/wits.err")"
  fi
  if stop_gateway; then pass "SIGTERM after the replay: exit 0"; else fail "SIGTERM: exit status"; fi
else
  fail "serve (for the WITS replay)"
fi

# --- 4. the rest of the command line -----------------------------------------------------
echo "== command line"
if "$SPILLWAY" completions bash >"$work/spillway.bash" && bash -n "$work/spillway.bash"; then
  pass "spillway completions bash"
else
  fail "spillway completions bash"
fi
if "$SPILLWAY" man --dir "$work/man" && [ -f "$work/man/spillway-serve.1" ]; then
  pass "spillway man --dir DIR"
else
  fail "spillway man --dir DIR"
fi
if "$SPILLWAY" --version | grep -q '^features: '; then
  pass "spillway --version"
else
  fail "spillway --version"
fi
aws_bin=""
for b in "$target/release/spillway" "$target/debug/spillway"; do
  if [ -x "$b" ] && "$b" --version | grep -q '^features: aws'; then aws_bin="$b"; break; fi
done
if [ -n "$aws_bin" ]; then
  if "$aws_bin" check config/aws.yaml; then
    pass "spillway check config/aws.yaml (with $aws_bin)"
  else
    fail "spillway check config/aws.yaml"
  fi
else
  skip "spillway check config/aws.yaml (no binary built with --features aws; scripts/test.sh builds one)"
fi

echo "== README and manual examples: $passed passed, $failed failed, $skipped skipped in $((SECONDS - started)) s"
[ $failed = 0 ]
