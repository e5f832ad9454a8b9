#!/usr/bin/env bash
# Make sure headless Chromium is there for tests/test_report_browser.py (the report checked in a browser).
# Uses Debian's `chromium` package: installs it with apt-get when missing and we are root; otherwise says
# what to run. Prints the version found. Exit 0 when a Chromium runs, 1 when it cannot be had.
set -euo pipefail

find_chromium() {
    if [[ -n "${DIAGNOSE_CHROMIUM:-}" && -x "${DIAGNOSE_CHROMIUM}" ]]; then echo "$DIAGNOSE_CHROMIUM"; return 0; fi
    command -v chromium || command -v chromium-browser || command -v google-chrome || return 1
}

if ! exe="$(find_chromium)"; then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "ensure_chromium: no Chromium found; install Debian's package: sudo apt-get install -y chromium" >&2
        exit 1
    fi
    echo "ensure_chromium: installing Debian's chromium package"
    t0=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
    echo "ensure_chromium: installed in $(( $(date +%s) - t0 ))s"
    exe="$(find_chromium)" || { echo "ensure_chromium: chromium installed but not on PATH" >&2; exit 1; }
fi
"$exe" --headless=new --no-sandbox --version 2>/dev/null | grep -v '^\[' || "$exe" --version
