# Shared helpers for the .ci scripts: print the command, run it, say PASS/FAIL.
set -euo pipefail
step() {
  local name=$1; shift
  echo "== ${name}: $*"
  local t0=$SECONDS
  if "$@"; then
    echo "== ${name}: PASS ($((SECONDS - t0)) s)"
  else
    local rc=$?
    echo "== ${name}: FAIL (exit ${rc}, $((SECONDS - t0)) s)"
    exit "$rc"
  fi
}
skip() { echo "== $1: SKIP ($2)"; }
