#!/usr/bin/env bash
# Lint and type-check as CI does (.ci/run calls the same two commands): ruff over the tree, then
# tools/typecheck.sh. Both run even if the first fails; the exit status is non-zero if either failed.
#     tools/check.sh                # uses .venv, or $VENV
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
export VENV
cd "$ROOT" || exit 2

rc=0
echo "== ruff check"
"$VENV/bin/ruff" check . || rc=1
echo "== mypy (tools/typecheck.sh)"
bash "$ROOT/tools/typecheck.sh" || rc=1
[[ $rc -eq 0 ]] && echo "check: OK" || echo "check: FAILED"
exit "$rc"
