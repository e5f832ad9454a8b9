#!/usr/bin/env bash
# The GPU checks, run once on a lent NVIDIA machine (the session's `device` tool), in one prepared script:
#   1. the NVML probe's cost per call and per tick, nvmlDeviceGetSamples vs polling (benchmarks/nvml_cost.py)
#   2. the real-NVML test (tests/test_nvml_gpu.py, marker gpu) while torch keeps the GPU busy
#   3. two real captures against harness/gpu_toy_engine.py (a toy continuous-batching engine on the GPU):
#      "decode_bw" (16 GB of weights read every step: memory-bandwidth-bound decode, with a CUDA profiler
#      window) and "host_bound" (10 ms of Python on the engine thread per step: the GPU waits), each
#      `diagnose attach` with NVML at its default 10 Hz and py-spy, then `diagnose analyze`.
# Results land in $W (default /tmp/gpu_work); $OUT gets them as one results.tgz (with the two bundles) plus
# nvml_cost.md. The machine has no network: the packages its image
# lacks travel as wheels in .whl/ (see the device README), diagnose itself as a wheel built here.
# Usage there: bash benchmarks/gpu_device_check.sh    (OUT=dir; ~3 min on an H200)
# Dry run on a machine without a GPU (checks the script, not the GPU):
#   SKIP_WHEELS=1 PY=.venv/bin/python ENGINE_PY=/path/to/python-with-torch \
#   TOY_EXTRA="--device cpu --weights-gb 0.05 --hidden 1024" bash benchmarks/gpu_device_check.sh
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_out}"
W="${W:-/tmp/gpu_work}"
PY="${PY:-python3}"
ENGINE_PY="${ENGINE_PY:-$PY}"
TOY_EXTRA="${TOY_EXTRA:-}"
mkdir -p "$OUT" "$W"
if [[ -z "${SKIP_WHEELS:-}" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
    # the checkout's diagnose/ comes first on sys.path (python -m, tests/conftest.py) and shadows the wheel:
    # give it the subpackages the way pyproject's package-dir maps them (this copy of the tree is throwaway)
    for d in probes rules reports; do [[ -e "diagnose/$d" ]] || ln -s "../$d" "diagnose/$d"; done
fi
log() { printf '\n===== %s (%s)\n' "$*" "$(date +%T)"; }

log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.max.mem --format=csv \
    2>&1 | tee "$W/machine.txt"
"$PY" -c "import sys, pynvml; print('pynvml', pynvml.__file__, sys.version.split()[0])" 2>&1 | tee -a "$W/machine.txt"
nproc | tee -a "$W/machine.txt"

log "1. NVML cost"
timeout 90 "$PY" benchmarks/nvml_cost.py --seconds 8 --out "$W/nvml_cost.md" > /dev/null 2>"$W/nvml_cost.err" \
    && cat "$W/nvml_cost.md" || { echo "nvml_cost failed"; tail -5 "$W/nvml_cost.err"; }

log "2. real-NVML test"
timeout 120 "$ENGINE_PY" -m pytest -q -s -m gpu tests/test_nvml_gpu.py -p no:cacheprovider 2>&1 | tail -15

# capture NAME PORT ENGINE_ARGS... -- ATTACH_ARGS...
capture() {
    local name="$1" port="$2"
    shift 2
    local eargs=() aargs=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do eargs+=("$1"); shift; done
    shift
    aargs=("$@")
    log "3. capture $name"
    # shellcheck disable=SC2086  # TOY_EXTRA is a list of flags
    "$ENGINE_PY" harness/gpu_toy_engine.py --port "$port" "${eargs[@]}" $TOY_EXTRA > "$W/engine_$name.log" 2>&1 &
    local pid=$!
    "$PY" - "$port" "$pid" <<'PYEOF'
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("engine exited")
        time.sleep(0.5)
PYEOF
    head -3 "$W/engine_$name.log"
    rm -rf "/tmp/b_$name"
    timeout 150 "$PY" -m diagnose attach --url "http://127.0.0.1:$port" --no-metrics --pyspy --pid "$pid" \
        -o "/tmp/b_$name" "${aargs[@]}" 2>&1 | tail -12
    echo "attach exit ${PIPESTATUS[0]}"
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    timeout 120 "$PY" -m diagnose analyze "/tmp/b_$name" -o "$W/report_$name.html" --json "$W/findings_$name.json" \
        2>&1 | tail -5
    "$PY" - "$W/findings_$name.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("run_valid", d.get("run_valid"), "|", d.get("verdict"))
for f in d.get("findings", [])[:12]:
    print(f.get("severity"), f.get("rule_id"), "|", str(f.get("title"))[:150])
print("not evaluated:", [n.get("rule_id") for n in d.get("not_evaluated", []) if isinstance(n, dict)])
sig = d.get("signals", {})
for k in sorted(sig):
    if k.startswith(("gpu_", "host_thread", "host_engine", "trace_", "ttft_p", "itl_p", "output_tps")):
        v = sig[k]
        v = v.get("value", v) if isinstance(v, dict) else v
        print("  ", k, round(v, 4) if isinstance(v, float) else v)
PYEOF
}

capture decode_bw 8101 --weights-gb 16 --hidden 16384 --max-batch 64 --profiler-dir /tmp/prof -- \
    -c 32 -d 15s --input-tokens 128 --output-tokens 64 --baseline 4 --slo itl_p99=6ms,ttft_p99=250ms \
    --profile-iterations 8 --profiler-dir /tmp/prof
capture host_bound 8102 --weights-gb 2 --hidden 16384 --max-batch 64 --host-ms 10 -- \
    -c 32 -d 15s --input-tokens 128 --output-tokens 64 --baseline 4 --slo itl_p99=6ms,ttft_p99=250ms

log "results"
cp "$W/nvml_cost.md" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$(dirname "$W")" "$(basename "$W")" -C /tmp b_decode_bw b_host_bound 2>&1 | tail -2
ls -la "$OUT"
