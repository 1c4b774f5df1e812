#!/usr/bin/env bash
# Every test of the workspace — the README's test command and what .ci/run runs.
#
#   scripts/test.sh                 # install what the tests need when missing, then run them all
#   scripts/test.sh --install-only  # only the installs (.ci/run, before cfn-lint)
#
# Installs, when missing: `redis-server` (tests/replicas.rs starts one per test; apt-get,
# as root or with passwordless sudo), Python's `moto[server]` (the AWS tests run against moto_server
# on 127.0.0.1), `aws-lambda-powertools[parser]` (tests/aws_lambda.rs validates Lambda
# events against its models) and `cfn-lint` (.ci/run lints deploy/aws with it), with pip.
# Then:
#   cargo test --workspace --all-features --locked --tests
# and, when traces/ holds the fetched traces (scripts/fetch-traces.sh), the tests that
# read them (marked #[ignore] so that a clone without them passes).
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true

need_python() {
  command -v python3 >/dev/null || {
    echo "test.sh: python3 with pip is needed to install $1" >&2
    exit 1
  }
}
pip_install() {
  need_python "$1"
  echo "== installing $1 (pip)"
  python3 -m pip install --quiet "$1" || python3 -m pip install --quiet --user "$1"
  if command -v pyenv >/dev/null; then pyenv rehash || true; fi
  # pip --user puts scripts here.
  export PATH="$PATH:$(python3 -m site --user-base 2>/dev/null)/bin"
  hash -r
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
command -v moto_server >/dev/null || pip_install 'moto[server]'
command -v cfn-lint >/dev/null || pip_install cfn-lint
python3 -c 'import pydantic, aws_lambda_powertools.utilities.parser.models' 2>/dev/null \
  || pip_install 'aws-lambda-powertools[parser]'
command -v moto_server >/dev/null || {
  echo "test.sh: moto_server is still not on PATH after installing moto[server]" >&2
  exit 1
}

[ "${1:-}" = "--install-only" ] && exit 0

echo "== cargo test --workspace --all-features --locked --tests"
cargo test --workspace --all-features --locked --tests

if [ -f traces/wits_per_second.txt ] && [ -f traces/square_per_second.txt ]; then
  echo "== tests that read traces/ (cargo test ... -- --ignored)"
  cargo test --workspace --all-features --locked --tests -- --ignored
else
  echo "== skipped: the tests that read traces/ (fetch them with scripts/fetch-traces.sh)"
fi
