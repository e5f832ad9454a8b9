#!/usr/bin/env bash
# Type-check diagnose the way it is imported: probes/, rules/ and reports/ install as diagnose.probes,
# diagnose.rules and diagnose.reports (package-dir mapping), so mypy runs over a copy laid out that way.
# Developers and .ci/run both call this script:
#     tools/typecheck.sh            # uses .venv/bin/mypy, or $VENV/bin/mypy
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
MYPY="$VENV/bin/mypy"
if [[ ! -x "$MYPY" ]]; then
    echo "typecheck: no mypy at $MYPY (run: python3 -m venv .venv && .venv/bin/pip install -e '.[dev]', or set VENV)" >&2
    exit 2
fi

# A fixed copy under .mypy_cache/ (ignored by git), mtimes kept (cp -p), so mypy's cache makes a second run
# incremental; a lock keeps two runs in the same checkout from sharing the copy.
CACHE="$ROOT/.mypy_cache"
tree="$CACHE/tree"
mkdir -p "$CACHE"
exec 9>"$CACHE/typecheck.lock"
if command -v flock >/dev/null; then flock 9; fi
rm -rf "$tree"
mkdir -p "$tree"
cp -rp "$ROOT/diagnose" "$tree/diagnose"
cp -rp "$ROOT/probes" "$tree/diagnose/probes"
cp -rp "$ROOT/rules" "$tree/diagnose/rules"
cp -rp "$ROOT/reports" "$tree/diagnose/reports"
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
cd "$tree" && "$MYPY" --config-file "$ROOT/pyproject.toml" --cache-dir "$CACHE" diagnose
