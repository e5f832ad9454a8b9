"""GEMMs bound by memory or by compute: bytes moved and FLOPs from the operator's shapes, against the device.

A trace recorded with ``record_shapes`` gives each GEMM operator (aten::mm, addmm, bmm, baddbmm, _scaled_mm)
its input shapes and types. The kernels it launched are found by their launch call (the runtime call with the
kernel's correlation id) inside the operator on the same thread. Per operator: FLOPs ``2·B·M·N·K`` (addmm and
baddbmm add ``B·M·N`` for the bias), bytes moved ``(B·M·K + B·K·N + B·M·N)`` elements of their types plus the
bias (the formulas of AMD's TraceLens, whose GEMM table for the shipped H100 trace they reproduce), their
ratio (FLOPs per byte, the arithmetic intensity) and, over the time of the kernels it launched, the achieved
bandwidth and FLOP rate. Against the device the trace names (``deviceProperties``: its peak memory bandwidth
and 16-bit dense matrix throughput, table ``DEVICES``; fp8 at twice it; fp32 left unjudged), a GEMM whose intensity is below the device's ridge
point (peak FLOP/s over peak bytes/s) is memory-bound: a decode GEMM of a few rows against a large weight
reads the weight and does little with it. Unknown device: the bound is left unjudged.

One row per (operator, shape, type) of the rank: ``trace_gemm`` (docs/trace-analysis.md).
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from diagnose.trace.timeline import launch_row_for

COLUMNS = ["rank", "op", "b", "m", "n", "k", "dtype", "count", "kernels", "kernel_us", "gflops", "mbytes",
           "flops_per_byte", "tbps", "tflops", "ridge_flops_per_byte", "peak_tbps", "bound"]
# element sizes of the types a GEMM operator records (its "Input type")
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2": 1, "c10::Float8_e5m2fnuz": 1, "signed char": 1,
               "unsigned char": 1, "int": 4, "long int": 8}
# (name pattern, peak memory bandwidth TB/s, peak dense 16-bit matrix TFLOP/s): vendors' data sheets (SXM/OAM
# parts; a PCIe part is slower and listed first where its name says so)
DEVICES: tuple[tuple[re.Pattern[str], float, float], ...] = tuple((re.compile(p, re.I), bw, tf) for p, bw, tf in (
    (r"H100.*PCIe", 2.0, 756.0), (r"H100", 3.35, 989.0), (r"H200", 4.8, 989.0), (r"H20\b", 4.0, 148.0),
    (r"GH200", 4.0, 989.0), (r"B200", 8.0, 2250.0), (r"B100", 8.0, 1750.0), (r"L40S", 0.864, 362.0),
    (r"A100.*(80GB|SXM4-80)", 2.039, 312.0), (r"A100", 1.555, 312.0), (r"A10G?\b", 0.6, 125.0),
    (r"V100", 0.9, 125.0), (r"MI300X", 5.3, 1307.0), (r"MI325X", 6.0, 1307.0), (r"MI355X", 8.0, 2500.0),
    (r"MI250X?", 3.2, 383.0), (r"MI210", 1.6, 181.0),
))
# the matrix rate of a type against the 16-bit one: fp8 doubles it; an fp32 GEMM's rate depends on TF32 being
# allowed (PyTorch's default is not), so its bound is left unjudged
RATE = {1: 2.0, 2: 1.0}


def device_peaks(name: str) -> tuple[float, float] | None:
    """(peak bytes/s, peak FLOP/s) of a device named in the trace; None when it is not in ``DEVICES``."""
    for pat, bw, tf in DEVICES:
        if pat.search(name or ""):
            return bw * 1e12, tf * 1e12
    return None


def _dims(op: str, dims: Any) -> tuple[int, int, int, int, int] | None:
    """(B, M, N, K, bias elements) from the operator's input dims; None for a shape it does not have."""
    try:
        if op in ("aten::addmm", "aten::baddbmm"):
            bias, a, b = dims[0], dims[1], dims[2]
        else:
            a, b = dims[0], dims[1]
            bias = []
        if op in ("aten::bmm", "aten::baddbmm"):
            (bb, m, k), (_, _, n) = a, b
        else:
            (m, k), (_, n) = a, b
            bb = 1
        nb = int(np.prod(bias)) if bias else 0
        return int(bb), int(m), int(n), int(k), nb
    except (TypeError, ValueError, IndexError):
        return None


def _work(op: str, shape: Any) -> tuple[tuple[int, int, int, int], str, float, float] | None:
    """((B, M, N, K), input type, FLOPs, bytes moved) of one GEMM operator's recorded shapes."""
    dims, types = shape if isinstance(shape, tuple) else (None, None)
    d = _dims(op, dims)
    if d is None:
        return None
    b, m, n, k, bias = d
    types = list(types or [])
    ab = types[1:3] if op in ("aten::addmm", "aten::baddbmm") else types[:2]
    if len(ab) < 2 or any(t not in DTYPE_BYTES for t in ab):
        return None
    sa, sb = DTYPE_BYTES[ab[0]], DTYPE_BYTES[ab[1]]
    sc = max(sa, 2) if op != "aten::_scaled_mm" else 2  # fp8 GEMMs write 16-bit results
    flops = 2.0 * b * m * n * k + (b * m * n if bias else 0)
    moved = float(b * m * k * sa + b * k * n * sb + b * m * n * sc + bias * sc)
    return (b, m, n, k), str(ab[0]), flops, moved


def _owners(cpu_ops: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The GEMM operators recorded with shapes, and per GPU event the index of the one that launched it (the
    operator open on the launching thread at the launch, the latest started; -1: none)."""
    owner = np.full(len(gpu), -1)
    if "shape" not in cpu_ops or cpu_ops.empty or gpu.empty or runtime.empty:
        return cpu_ops.iloc[:0], owner
    ops = cpu_ops[cpu_ops["shape"].notna().to_numpy()].reset_index(drop=True)
    if ops.empty:
        return ops, owner
    # each GPU event's launch call (timeline.launch_row_for): its thread and start
    row = launch_row_for(gpu, runtime)
    hit = row >= 0
    rts, rtid = runtime["ts_us"].to_numpy(), runtime["tid"].to_numpy()
    o_ts, o_end, o_tid = (ops["ts_us"].to_numpy(), (ops["ts_us"] + ops["dur_us"]).to_numpy(),
                          ops["tid"].to_numpy())
    for tid in np.unique(o_tid):
        sel = np.flatnonzero(o_tid == tid)
        s = sel[np.argsort(o_ts[sel], kind="stable")]
        on = np.flatnonzero(hit & (rtid[np.maximum(row, 0)] == tid))
        lts = rts[row[on]]
        i = np.searchsorted(o_ts[s], lts, side="right") - 1
        ok = (i >= 0) & (o_end[s[np.maximum(i, 0)]] >= lts)
        owner[on[ok]] = s[i[ok]]
    return ops, owner


def _bound(w: tuple[tuple[int, int, int, int], str, float, float],
           peaks: tuple[float, float] | None) -> tuple[float | None, str]:
    """(the device's ridge point for the GEMM's type, "memory" | "compute" | "" unjudged)."""
    rate = RATE.get(DTYPE_BYTES.get(w[1], 0))
    if peaks is None or rate is None:
        return None, ""
    ridge = peaks[1] * rate / peaks[0]
    return ridge, "memory" if w[2] / w[3] < ridge else "compute"


def memory_bound_gemms(cpu_ops: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame, gemm_kernel: np.ndarray,
                       device: str) -> np.ndarray:
    """Per GPU event: a GEMM kernel whose operator's shapes make it memory-bound on this device."""
    out = np.zeros(len(gpu), dtype=bool)
    peaks = device_peaks(device)
    if peaks is None:
        return out
    ops, owner = _owners(cpu_ops, gpu, runtime)
    if ops.empty:
        return out
    names, shapes = ops["name"].astype(str).to_numpy(), ops["shape"].to_numpy()
    mem = np.zeros(len(ops), dtype=bool)
    for i in np.unique(owner[(owner >= 0) & gemm_kernel]).tolist():
        w = _work(names[i], shapes[i])
        mem[int(i)] = w is not None and _bound(w, peaks)[1] == "memory"
    return gemm_kernel & (owner >= 0) & mem[np.maximum(owner, 0)]


def _works(names: np.ndarray, shapes: np.ndarray, idx: list[int]) -> dict[int, Any]:
    """``_work`` of the operators ``idx``, once per distinct (operator, shapes): a model's layers repeat a few."""
    seen: dict[tuple[str, str], Any] = {}
    out = {}
    for i in idx:
        key = (names[i], repr(shapes[i]))
        if key not in seen:
            seen[key] = _work(names[i], shapes[i])
        out[i] = seen[key]
    return out


class _GemmSum(TypedDict):
    """One GEMM shape's kernels of one rank, summed."""

    count: int
    kernels: int
    kernel_us: float
    flops: float
    bytes: float


def gemm_table(cpu_ops: pd.DataFrame, gpu: pd.DataFrame, runtime: pd.DataFrame, gemm_kernel: np.ndarray,
               rank: int, device: str) -> pd.DataFrame:
    """One row per (operator, shape, type): the GEMM operators recorded with shapes and the GPU time of what
    they launched (``gemm_kernel``: per GPU event, whether it is a GEMM-class kernel)."""
    ops, owner = _owners(cpu_ops, gpu, runtime)
    if ops.empty:
        return pd.DataFrame(columns=COLUMNS)
    kind = gpu["kind"].astype(str).to_numpy()
    dur = gpu["dur_us"].to_numpy(dtype=float)
    linked = owner >= 0
    busy = pd.Series(dur[linked & (kind != "memcpy")]).groupby(owner[linked & (kind != "memcpy")]).sum()
    n_gemm = pd.Series(np.ones(int((linked & gemm_kernel).sum()))).groupby(owner[linked & gemm_kernel]).sum()
    peaks = device_peaks(device)
    rows: dict[tuple[Any, ...], _GemmSum] = {}
    names, shapes = ops["name"].astype(str).to_numpy(), ops["shape"].to_numpy()
    busy_of = busy.to_dict()
    per_op = n_gemm.to_dict()
    works = _works(names, shapes, list(per_op))
    for i, kernels in per_op.items():
        w = works[i]
        if w is None:
            continue
        (b, m, n, k), dtype, flops, moved = w
        key = (names[i], b, m, n, k, dtype)
        r = rows.setdefault(key, {"count": 0, "kernels": 0, "kernel_us": 0.0, "flops": flops, "bytes": moved})
        r["count"] += 1
        r["kernels"] += int(kernels)
        r["kernel_us"] += float(busy_of.get(i, 0.0))
    out = []
    for (op, b, m, n, k, dtype), r in rows.items():
        t_s = r["kernel_us"] / r["count"] / 1e6
        ridge, bound = _bound(((b, m, n, k), dtype, r["flops"], r["bytes"]), peaks)
        out.append({"rank": rank, "op": op, "b": b, "m": m, "n": n, "k": k, "dtype": dtype, "count": r["count"],
                    "kernels": r["kernels"], "kernel_us": r["kernel_us"], "gflops": r["flops"] / 1e9,
                    "mbytes": r["bytes"] / 2**20, "flops_per_byte": r["flops"] / r["bytes"],
                    "tbps": r["bytes"] / t_s / 1e12 if t_s > 0 else np.nan,
                    "tflops": r["flops"] / t_s / 1e12 if t_s > 0 else np.nan,
                    "ridge_flops_per_byte": ridge if ridge is not None else np.nan,
                    "peak_tbps": peaks[0] / 1e12 if peaks is not None else np.nan, "bound": bound})
    return pd.DataFrame(out, columns=COLUMNS).sort_values("kernel_us", ascending=False, ignore_index=True)
