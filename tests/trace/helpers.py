"""Small synthetic Kineto traces for edge cases the real traces do not cover (bad input, units, layout)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data" / "traces"


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


def launch(name: str, ts: float, dur: float, corr: int, tid: int = 100) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def step_gpu_work(t: float, corr: int, eager: int = 0) -> tuple[list[dict[str, Any]], float, int]:
    """One synthetic vLLM step's GPU work from ``t``: ``eager`` eager GEMMs (a launch each, 30 us apart), or,
    with ``eager=0``, one CUDA-graph replay of 100 GEMMs. Returns (events, the time after it, last correlation
    id)."""
    evs: list[dict[str, Any]] = []
    if eager:
        for _k in range(eager):
            corr += 1
            evs += [launch("cudaLaunchKernel", t, 5, corr), kernel("gemm_bf16", t + 6, 30, corr)]
            t += 30
        return evs, t, corr
    corr += 1
    evs.append(launch("cudaGraphLaunch", t, 20, corr))
    evs += [kernel("gemm_bf16", t + 25 + 19 * k, 18, corr) for k in range(100)]
    return evs, t + 1925, corr


def annotation(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur}


def write_trace(path: Path, events: list[dict[str, Any]], *, gz: bool = False, indent: int | None = None,
                **meta: Any) -> Path:
    doc = {"schemaVersion": 1, **meta, "traceEvents": events, "traceName": str(path)}
    data = json.dumps(doc, indent=indent).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path
