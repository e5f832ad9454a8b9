"""Signals (source="trace") and plain-data report sections from the trace tables.

Every signal name, unit and definition is listed in docs/trace-analysis.md. A signal whose input is missing
(no GPU events, no steps, one rank) is absent, never zero.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analysis import Section
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


def build_signals(tables: dict[str, pd.DataFrame], summary: dict[str, Any]) -> list[Signal]:
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


def _cell(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if not math.isfinite(f) else round(f, 4)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v if isinstance(v, (int, str, bool)) or v is None else str(v)


def table_payload(df: pd.DataFrame, note: str = "", limit: int = 50) -> dict[str, Any]:
    df = df.head(limit)
    return {"columns": [str(c) for c in df.columns],
            "rows": [[_cell(v) for v in row] for row in df.itertuples(index=False, name=None)], "note": note}


def build_sections(tables: dict[str, pd.DataFrame], summary: dict[str, Any], warnings: list[str]) -> list[Section]:
    secs: list[Section] = []
    lines = [f"Trace files: {len(summary['files'])}; ranks: {summary['ranks']}; events: {summary['events']:,}; "
             f"devices: {', '.join(summary['devices']) or 'not recorded'}."]
    if not summary["gpu"]:
        lines.append("No GPU events: this is a CPU-only trace; CPU ops and engine steps are analysed.")
    lines += [f"Warning: {w}" for w in warnings]
    secs.append(Section("trace_overview", "Trace overview", "text", {"text": "\n".join(lines)}, "trace", 10))
    g = tables.get("trace_gpu_time", pd.DataFrame())
    if not g.empty:
        secs.append(Section("trace_gpu_time_bars", "GPU time per rank", "stacked_bars", {
            "categories": [f"rank {r}" for r in g["rank"]],
            "series": [{"name": n, "values": [round(float(v) / 1e3, 3) for v in g[c]]}
                       for n, c in (("compute", "compute_us"), ("communication (exposed)", "comm_exposed_us"),
                                    ("memory (exposed)", "memory_exposed_us"), ("idle", "idle_us"))],
            "unit": "ms", "x_label": "rank", "y_label": "ms"}, "trace", 20))
        secs.append(Section("trace_gpu_time", "GPU busy, idle, compute and communication", "table",
                            table_payload(g, "window = first to last GPU activity of the rank"), "trace", 21))
    idle = tables.get("trace_idle", pd.DataFrame())
    if not idle.empty:
        secs.append(Section("trace_idle", "Idle attribution (all streams merged)", "table", table_payload(
            idle, "host_wait: launched after the GPU went idle; launch_overhead: gap < 30 µs; other: waits, syncs"),
            "trace", 22))
    for key, title, order in (("trace_kernel_classes", "Kernel classes", 30), ("trace_top_kernels", "Top kernels",
                                                                                31),
                              ("trace_launch", "Launch overhead (graph-aware)", 40),
                              ("trace_sync", "Host synchronisation and synchronous copies", 41),
                              ("trace_transfers", "Memory transfers", 42),
                              ("trace_step_summary", "Engine steps by type", 50),
                              ("trace_rank_skew", "Ranks at collectives", 60), ("trace_cpu_ops", "Top CPU ops", 70)):
        df = tables.get(key, pd.DataFrame())
        if not df.empty:
            secs.append(Section(key, title, "table", table_payload(df), "trace", order))
    st = tables.get("trace_steps", pd.DataFrame())
    if not st.empty:
        secs.append(Section("trace_step_hist", "Engine-step duration", "histogram", {
            "values": [round(float(v) / 1e3, 4) for v in st["dur_us"].to_numpy()[:20000]], "bins": 40,
            "x_label": "step duration", "unit": "ms"}, "trace", 51))
    return secs
