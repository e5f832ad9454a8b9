#!/usr/bin/env bash
# Make sure a Prometheus server binary is installed (Debian's `prometheus` package) for the fleet tests
# (tests/engine/test_fleet_vllm.py start their own on loopback: harness/prometheus.py). Idempotent: does
# nothing when `prometheus` (or $DIAGNOSE_PROMETHEUS) is already there. Needs root (apt-get) otherwise.
# The package's own service is not started (no init in CI; policy-rc.d may deny it): the tests run theirs.
set -euo pipefail

BIN="${DIAGNOSE_PROMETHEUS:-prometheus}"
if command -v "$BIN" >/dev/null 2>&1; then
    echo "prometheus: $("$BIN" --version 2>&1 | head -1)"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "prometheus is not installed and this is not root: apt-get install -y prometheus (as root)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends prometheus >/dev/null
# the package's service, if something started it, is not ours to keep
if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
echo "prometheus: $(prometheus --version 2>&1 | head -1)"
