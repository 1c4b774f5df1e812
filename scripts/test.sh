#!/usr/bin/env bash
# Every test of the workspace — the README's test command and what .ci/run runs.
#
#   scripts/test.sh                 # install what the tests need when missing, then run them all
#   scripts/test.sh --install-only  # only the installs (.ci/run, before cfn-lint)
#
# Installs `redis-server` when missing (tests/replicas.rs starts one per test; apt-get, as
# root or with passwordless sudo).
# The Python tools the tests need — `moto[server]` (the AWS tests run against moto_server
# on 127.0.0.1), `aws-lambda-powertools[parser]` (tests/aws_lambda.rs validates Lambda
# events against its models) and `cfn-lint` (.ci/run lints deploy/aws with it) — go into a
# virtual environment, never into the system Python (which Debian and Ubuntu refuse:
# "externally managed"): $SPILLWAY_VENV, default ${CARGO_TARGET_DIR:-target}/python-venv,
# made by $SPILLWAY_PYTHON (default python3; .ci/run uses /usr/bin/python3). When that
# Python cannot make one (no ensurepip), python3-venv is installed with apt-get (as root
# or with passwordless sudo), else the script stops and says what to install. A virtual
# environment made by another Python is made again. The tests then run with its bin/
# first on PATH, so moto_server, cfn-lint and python3 are the environment's. Then:
#   cargo test --workspace --all-features --locked --tests --benches
# (the benches run once each, as tests, so that none rots), and, when traces/ holds the fetched traces (scripts/fetch-traces.sh), the tests that
# read them (marked #[ignore] so that a clone without them passes).
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true

py="${SPILLWAY_PYTHON:-python3}"
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
venv="${SPILLWAY_VENV:-$(cd "$target" && pwd)/python-venv}"

command -v "$py" >/dev/null || {
  echo "test.sh: $py is needed to make the virtual environment of the test tools (set SPILLWAY_PYTHON to another Python 3)" >&2
  exit 1
}

# Install python3-venv with apt-get when $py has no ensurepip (Debian's python3 without it).
ensure_venv_module() {
  "$py" -c 'import ensurepip, venv' 2>/dev/null && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
      echo "test.sh: $py cannot make a virtual environment (no ensurepip); install python3-venv (apt-get install python3-venv) and run again" >&2
      exit 1
    fi
  fi
  command -v apt-get >/dev/null || {
    echo "test.sh: $py cannot make a virtual environment (no ensurepip) and there is no apt-get: install Python's venv module" >&2
    exit 1
  }
  local version
  version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  echo "== installing python3-venv (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv "python$version-venv" >/dev/null 2>&1 \
    || { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 \
         && "${sudo[@]}" apt-get install -y -qq --no-install-recommends python3-venv "python$version-venv" >/dev/null 2>&1; } \
    || true
  "$py" -c 'import ensurepip, venv' 2>/dev/null || {
    echo "test.sh: apt-get could not install python3-venv; install it and run again" >&2
    exit 1
  }
}

# The interpreter a virtual environment (or $py) runs on, resolved.
base_of() { "$1" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))' 2>/dev/null; }

want=$(base_of "$py") || { echo "test.sh: $py does not run" >&2; exit 1; }
if [ -x "$venv/bin/python" ] && [ "$(base_of "$venv/bin/python" || true)" != "$want" ]; then
  echo "== $venv was made by another Python: making it again with $py"
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  ensure_venv_module
  echo "== virtual environment $venv ($py, $want)"
  "$py" -m venv "$venv"
fi
vpy="$venv/bin/python"
pip_install() {
  echo "== installing $1 (pip, into $venv)"
  "$vpy" -m pip install --quiet --disable-pip-version-check "$1"
}
if ! command -v redis-server >/dev/null; then
  echo "== installing redis-server (apt-get)"
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo -n)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server >/dev/null 2>&1 \
    || { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 \
         && "${sudo[@]}" apt-get install -y -qq --no-install-recommends redis-server >/dev/null 2>&1; } \
    || true
  command -v redis-server >/dev/null || {
    echo "test.sh: redis-server is needed by tests/replicas.rs: apt-get install redis-server" >&2
    exit 1
  }
fi
[ -x "$venv/bin/moto_server" ] || pip_install 'moto[server]'
[ -x "$venv/bin/cfn-lint" ] || pip_install cfn-lint
"$vpy" -c 'import pydantic, aws_lambda_powertools.utilities.parser.models' 2>/dev/null \
  || pip_install 'aws-lambda-powertools[parser]'
export PATH="$venv/bin:$PATH"
hash -r
[ "$(command -v moto_server)" = "$venv/bin/moto_server" ] || {
  echo "test.sh: moto_server is not in $venv/bin after installing moto[server]" >&2
  exit 1
}

[ "${1:-}" = "--install-only" ] && exit 0

echo "== cargo test --workspace --all-features --locked --tests --benches (Python tools from $venv)"
cargo test --workspace --all-features --locked --tests --benches

if [ -f traces/wits_per_second.txt ] && [ -f traces/square_per_second.txt ]; then
  echo "== tests that read traces/ (cargo test ... -- --ignored)"
  cargo test --workspace --all-features --locked --tests -- --ignored
else
  echo "== skipped: the tests that read traces/ (fetch them with scripts/fetch-traces.sh)"
fi
