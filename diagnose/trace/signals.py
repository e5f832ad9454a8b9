"""Signals (source="trace") from the trace tables: a function of the tables only, so the bundle normaliser
(diagnose/normalize/trace.py) and a lone trace compute them the same way.

Every signal name, unit and definition is listed in docs/trace-analysis.md. A signal whose input is missing
(no GPU events, no steps, one rank) is absent, never zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diagnose.model import Signal


def _sig(out: list[Signal], name: str, value: Any, unit: str, desc: str) -> None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return
    if math.isfinite(v):
        out.append(Signal(name=name, value=v, unit=unit, source="trace", description=desc))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def trace_signals(tables: Mapping[str, pd.DataFrame]) -> list[Signal]:
    """Every trace signal the tables support (docs/trace-analysis.md)."""
    out: list[Signal] = []
    g = tables.get("trace_gpu_time", pd.DataFrame())
    if not g.empty:
        w = float(g["window_us"].sum())
        _sig(out, "trace_gpu_busy_ratio", _ratio(g["busy_us"].sum(), w), "ratio",
             "GPU busy (union of kernel, memcpy and memset intervals) over first-to-last GPU activity, all ranks")
        _sig(out, "trace_gpu_idle_ratio", _ratio(g["idle_us"].sum(), w), "ratio", "GPU idle share of the window")
        _sig(out, "trace_gpu_compute_ratio", _ratio(g["compute_us"].sum(), w), "ratio",
             "union of compute kernels over the window")
        _sig(out, "trace_gpu_comm_exposed_ratio", _ratio(g["comm_exposed_us"].sum(), w), "ratio",
             "communication not overlapped by compute, over the window")
        _sig(out, "trace_gpu_memory_exposed_ratio", _ratio(g["memory_exposed_us"].sum(), w), "ratio",
             "memcpy/memset not overlapped by compute or communication, over the window")
        _sig(out, "trace_comm_overlap_ratio", _ratio(g["comm_overlapped_us"].sum(), g["comm_total_us"].sum()),
             "ratio", "share of communication time overlapped by compute")
        _sig(out, "trace_gpu_kernels_count", g["kernels"].sum(), "count", "GPU kernels in the trace")
        if len(g) > 1:
            _sig(out, "trace_rank_busy_spread_ratio", g["busy_ratio"].max() - g["busy_ratio"].min(), "ratio",
                 "max minus min GPU busy ratio across ranks")
    idle = tables.get("trace_idle", pd.DataFrame())
    if not idle.empty:
        tot = float(idle["idle_us"].sum())
        for k in ("host_wait", "launch_overhead", "other"):
            _sig(out, f"trace_gpu_idle_{k}_ratio", _ratio(idle[f"{k}_us"].sum(), tot), "ratio",
                 f"share of GPU idle time (gaps between activity, all streams merged) attributed to {k}")
    ls = tables.get("trace_launch_summary", pd.DataFrame())
    if not ls.empty and "eager_kernels" in ls:
        eager = float(ls["eager_kernels"].fillna(0).sum())
        _sig(out, "trace_launch_bound_kernel_ratio", _ratio(ls["launch_bound_kernels"].fillna(0).sum(), eager),
             "ratio", "eagerly launched kernels whose GPU time is shorter than their CPU launch call")
        _sig(out, "trace_launch_call_p50_us", ls["launch_call_p50_us"].median(), "us",
             "median CPU time of a kernel launch call (eager launches)")
        _sig(out, "trace_launch_delay_p50_us", ls["launch_delay_p50_us"].median(), "us",
             "median delay from the end of the launch call to the kernel start (eager launches)")
        _sig(out, "trace_kernel_dur_p50_us", ls["kernel_dur_p50_us"].median(), "us", "median eager kernel duration")
    if not ls.empty:
        gk = float(ls["graph_kernels"].fillna(0).sum()) if "graph_kernels" in ls else 0.0
        _sig(out, "trace_graph_kernel_ratio", _ratio(gk, float(ls["kernels_matched"].sum())), "ratio",
             "share of launched kernels that ran inside CUDA/HIP graph replays")
    sync = tables.get("trace_sync", pd.DataFrame())
    if not sync.empty:
        _sig(out, "trace_sync_total_ms", sync["total_ms"].sum(), "ms",
             "CPU time in host synchronisation and synchronous memcpy/memset calls")
    tr = tables.get("trace_transfers", pd.DataFrame())
    if not tr.empty:
        _sig(out, "trace_async_pageable_copies_count", tr["async_pageable"].sum(), "count",
             "async memcpy calls on pageable host memory (they run synchronously)")
    _step_signals(out, tables.get("trace_steps", pd.DataFrame()))
    rk = tables.get("trace_rank_skew", pd.DataFrame())
    coll = tables.get("trace_collectives", pd.DataFrame())
    if not coll.empty:
        sk = coll["skew_us"].to_numpy()
        _sig(out, "trace_collective_skew_p50_us", np.percentile(sk, 50), "us",
             "median spread of start times of the same collective across ranks")
        _sig(out, "trace_collective_skew_p99_us", np.percentile(sk, 99), "us", "P99 of that spread")
        _sig(out, "trace_straggler_last_share_ratio", rk["last_share_ratio"].max(), "ratio",
             "share of collectives that the most frequent last rank started last")
        if "wait_us" in rk:
            _sig(out, "trace_collective_wait_ratio", _ratio(rk["wait_us"].sum(), rk["comm_us"].sum()), "ratio",
                 "share of matched collective kernel time spent waiting for the last rank to start")
    return out


def _step_signals(out: list[Signal], st: pd.DataFrame) -> None:
    if st.empty:
        return
    d = st["dur_us"].to_numpy(dtype=float) / 1e3
    _sig(out, "trace_steps_count", len(st), "count", "engine steps found in the trace annotations")
    for kind in ("prefill", "decode", "mixed"):
        n = int((st["step_type"] == kind).sum())
        if n or (st["source"] != "profiler_step").any():
            _sig(out, f"trace_step_{kind}_count", n, "count", f"{kind} steps")
    _sig(out, "trace_step_dur_p50_ms", np.percentile(d, 50), "ms", "median engine-step duration (CPU annotation)")
    _sig(out, "trace_step_dur_p99_ms", np.percentile(d, 99), "ms", "P99 engine-step duration")
    gaps = st["cpu_gap_before_us"].dropna().to_numpy(dtype=float) / 1e3
    if len(gaps):
        _sig(out, "trace_inter_step_gap_p50_ms", np.percentile(gaps, 50), "ms", "median CPU time between steps")
    if st["gpu_busy_ratio"].notna().any():
        _sig(out, "trace_step_gpu_busy_ratio", _ratio(st["gpu_busy_us"].sum(), st["gpu_span_us"].sum()), "ratio",
             "GPU busy time of the kernels launched by steps over the steps' GPU spans")
    if st["sync_us"].notna().any():
        _sig(out, "trace_sync_in_step_ms", st["sync_us"].mean() / 1e3, "ms",
             "mean CPU time per step in host syncs and synchronous copies")
        _sig(out, "trace_sync_in_step_ratio", _ratio(st["sync_us"].sum(), st["dur_us"].sum()), "ratio",
             "share of step time spent in host syncs and synchronous copies")
    dec = st[st["step_type"] == "decode"]
    if not dec.empty:
        _sig(out, "trace_decode_step_p50_ms", dec["dur_us"].median() / 1e3, "ms", "median decode-step duration")
        if dec["kernel_us"].notna().any():
            _sig(out, "trace_decode_memory_bound_ratio", _ratio(dec["memory_bound_us"].sum(),
                                                                 dec["kernel_us"].sum()), "ratio",
                 "decode-step kernel time in memory-bound classes (memcpy/memset, norm/elementwise, attention, "
                 "sampling)")
    mix = st[st["step_type"] == "mixed"]
    if len(mix) >= 2 and len(dec) >= 2:
        _sig(out, "trace_mixed_step_inflation_ratio", mix["dur_us"].median() / dec["dur_us"].median(), "ratio",
             "median mixed (prefill+decode) step duration over median pure decode step duration")
