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
from diagnose.trace import steps
from diagnose.trace.host_stall import STALL_STEP_MIN_SHARE


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
    w = float("nan")  # the window (trace time) the window shares are over
    g = tables.get("trace_gpu_time", pd.DataFrame())
    idle = tables.get("trace_idle", pd.DataFrame())
    # the window before the first kernel launched inside the trace that ran promptly, when the GPU was busy
    # with work the trace does not show, is left out of the window (timeline.idle_attribution)
    pre = float(idle["pre_trace_us"].fillna(0).sum()) if "pre_trace_us" in idle else 0.0
    if not g.empty:
        w = float(g["window_us"].sum()) - pre
        _sig(out, "trace_gpu_busy_ratio", _ratio(g["busy_us"].sum(), w), "ratio",
             "GPU busy (union of kernel, memcpy and memset intervals) over first-to-last GPU activity, all ranks, "
             "less the window before the trace's own work began")
        _sig(out, "trace_gpu_idle_ratio", _ratio(g["idle_us"].sum() - pre, w), "ratio",
             "GPU idle share of the window (less the window before the trace's own work began)")
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
        _comm_signals(out, tables.get("trace_comm_split", pd.DataFrame()), g, w)
        if not idle.empty and "launch_explained_us" in idle:
            _sig(out, "trace_gpu_launch_idle_ratio", _ratio(idle["launch_explained_us"].sum(), w), "ratio",
                 "GPU idle in gaps a launch explains (up to 200 µs before an eagerly launched kernel that started "
                 "within 30 µs of its launch call: the CPU was behind; gaps inside graph replays excluded), over "
                 "the window")
    if not idle.empty:
        tot = float(idle["idle_us"].sum()) - pre
        for k in ("host_wait", "launch_overhead", "other", "queued", "graph_internal"):
            if f"{k}_us" not in idle:
                continue
            v = idle[f"{k}_us"].sum() - (pre if k == "queued" else 0.0)
            _sig(out, f"trace_gpu_idle_{k}_ratio", _ratio(v, tot), "ratio",
                 f"share of GPU idle time (gaps between activity, all streams merged, less the window before the "
                 f"trace's own work) attributed to {k}")
        if "launch_explained_us" in idle:
            _sig(out, "trace_gpu_idle_launch_explained_ratio", _ratio(idle["launch_explained_us"].sum(), tot), "ratio",
                 "share of GPU idle time in gaps a launch explains (the CPU behind the GPU; see "
                 "trace_gpu_launch_idle_ratio)")
        _sig(out, "trace_idle_gaps_count", idle["idle_gaps"].sum(), "count", "GPU idle gaps (all streams merged)")
        _sig(out, "trace_gpu_pre_trace_ms", pre / 1e3, "ms",
             "GPU idle in the trace before the first kernel that ran promptly after its launch, while kernels "
             "launched in the trace queued behind work not in it (excluded from the idle shares)")
    cap = tables.get("trace_capture", pd.DataFrame())
    if not cap.empty:
        _sig(out, "trace_capture_flag", 1.0, "flag", "the trace records a CUDA/HIP graph capture, not serving")
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
        if "eager_kernels" in ls:
            _sig(out, "trace_eager_kernel_ratio", _ratio(float(ls["eager_kernels"].fillna(0).sum()),
                                                          float(ls["kernels_matched"].sum())), "ratio",
                 "share of launched kernels launched one by one (not in a graph replay)")
            _sig(out, "trace_eager_kernels_count", ls["eager_kernels"].fillna(0).sum(), "count",
                 "kernels launched one by one")
    sync = tables.get("trace_sync", pd.DataFrame())
    if not sync.empty:
        _sig(out, "trace_sync_total_ms", sync["total_ms"].sum(), "ms",
             "CPU time in host synchronisation and synchronous memcpy/memset calls")
    tr = tables.get("trace_transfers", pd.DataFrame())
    if not tr.empty:
        _sig(out, "trace_async_pageable_copies_count", tr["async_pageable"].sum(), "count",
             "async memcpy calls on pageable host memory (they run synchronously)")
        if "async_pageable_us" in tr:
            _sig(out, "trace_async_pageable_copy_ratio", _ratio(float(tr["async_pageable_us"].sum()), w), "ratio",
                 "GPU time of the async copies on pageable host memory over the window: the most those copies "
                 "can cost (they run synchronously)")
    _step_signals(out, tables.get("trace_steps", pd.DataFrame()))
    _gemm_signals(out, tables.get("trace_gemm", pd.DataFrame()), tables.get("trace_kernel_classes", pd.DataFrame()))
    _stall_signals(out, tables.get("trace_host_stalls", pd.DataFrame()), tables.get("trace_steps", pd.DataFrame()))
    rk = tables.get("trace_rank_skew", pd.DataFrame())
    coll = tables.get("trace_collectives", pd.DataFrame())
    if not coll.empty:
        sk = coll["skew_us"].to_numpy()
        _sig(out, "trace_collective_skew_p50_us", np.percentile(sk, 50), "us",
             "median spread of start times of the same collective across ranks")
        _sig(out, "trace_collective_skew_p99_us", np.percentile(sk, 99), "us", "P99 of that spread")
        _sig(out, "trace_collectives_count", len(coll), "count", "collectives matched across ranks")
        top = rk.sort_values(["last_share_ratio", "lag_us_mean"], ascending=False).iloc[0]
        _sig(out, "trace_straggler_last_share_ratio", top["last_share_ratio"], "ratio",
             "share of collectives that the most frequent last rank started last (ties within 5 µs: nobody last)")
        if top["times_last"] > 0:
            _sig(out, "trace_straggler_rank", top["rank"], "count", "the rank that started the most collectives last")
            lag = float(top.get("lag_us_p50", top["lag_us_mean"]))
            _sig(out, "trace_straggler_lag_p50_us", lag, "us",
                 "median lag of that rank behind the earliest rank at each collective")
            st = steps.included(tables.get("trace_steps", pd.DataFrame()))
            if len(st):
                _sig(out, "trace_straggler_lag_step_ratio", _ratio(lag, float(st["dur_us"].median())), "ratio",
                     "that median lag over the median engine-step duration: the share of a step the other ranks "
                     "wait for it")
            _straggler_idle(out, rk, top)
    return out


def _gemm_signals(out: list[Signal], gm: pd.DataFrame, classes: pd.DataFrame) -> None:
    """GEMMs by what bounds them (trace/gemm.py): only for a trace recorded with shapes."""
    if gm.empty:
        return
    gemm_ms = classes.loc[classes["class"] == "gemm", "total_ms"].sum() if "class" in classes else float("nan")
    shaped = float(gm["kernel_us"].sum())
    _sig(out, "trace_gemm_shaped_ratio", min(1.0, _ratio(shaped, gemm_ms * 1e3)), "ratio",
         "GEMM kernel time whose operator was recorded with its shapes (record_shapes)")
    judged = gm[gm["bound"] != ""]
    if judged.empty:
        return
    mem = judged[judged["bound"] == "memory"]
    _sig(out, "trace_gemm_memory_bound_ratio", _ratio(mem["kernel_us"].sum(), judged["kernel_us"].sum()), "ratio",
         "share of the shaped GEMMs' kernel time in GEMMs bound by memory bandwidth (FLOPs per byte moved below "
         "the device's ridge point)")
    if not mem.empty:
        moved = float((mem["mbytes"] * 2**20 * mem["count"]).sum())
        rate = _ratio(moved, float(mem["kernel_us"].sum()) / 1e6) / 1e12
        _sig(out, "trace_gemm_memory_bw_util_ratio", rate / float(mem["peak_tbps"].max()), "ratio",
             "bytes the memory-bound GEMMs moved per second of their kernels, over the device's peak bandwidth")


def _straggler_idle(out: list[Signal], rk: pd.DataFrame, top: pd.Series) -> None:
    """How much of the straggler's lag its GPU spent idle before the collective, beyond what the other ranks'
    GPUs idled there: near 1, its host launched late (CPU work, contention); near 0, its GPU was busy right up
    to the collective (longer kernels: a slower GPU or more work)."""
    if "pre_idle_us_p50" not in rk:
        return
    lag = float(top.get("lag_us_p50", top["lag_us_mean"]))
    mine = float(top["pre_idle_us_p50"])
    others = rk.loc[rk["rank"] != top["rank"], "pre_idle_us_p50"].to_numpy(float)
    if not (lag > 0 and np.isfinite(mine) and np.isfinite(others).any()):
        return
    excess = mine - float(np.nanmedian(others))
    _sig(out, "trace_straggler_idle_share_ratio", max(0.0, excess) / lag, "ratio",
         f"the straggler's GPU idle just before each collective beyond the other ranks' (median {excess:.0f} µs), "
         f"over its lag ({lag:.0f} µs): near 1 its host launched late, near 0 its GPU was busy up to it")


def _comm_signals(out: list[Signal], cs: pd.DataFrame, g: pd.DataFrame, w: float) -> None:
    if cs.empty:
        return
    tot = float(cs["total_us"].sum())
    wait = float(cs["wait_us"].sum())
    share = _ratio(wait, tot)
    exposed = float(g["comm_exposed_us"].sum())
    _sig(out, "trace_comm_wait_ratio", share, "ratio",
         "share of communication kernel time spent waiting for peer ranks (outliers over 4x their kind's median)")
    _sig(out, "trace_comm_wait_kernels_count", cs["wait_kernels"].sum(), "count",
         "collectives that waited for a peer (over 4x their kind's median)")
    _sig(out, "trace_comm_kernels_count", cs["kernels"].sum(), "count", "communication kernels")
    _sig(out, "trace_gpu_comm_wait_exposed_ratio", _ratio(exposed * share, w), "ratio",
         "exposed communication spent waiting for peer ranks, over the window")
    _sig(out, "trace_gpu_comm_transfer_exposed_ratio", _ratio(exposed * (1 - share), w), "ratio",
         "exposed communication spent transferring, over the window")
    custom = float(cs.loc[cs["impl"] == "custom all-reduce", "total_us"].sum())
    _sig(out, "trace_custom_allreduce_ratio", _ratio(custom, tot), "ratio",
         "share of communication time in custom (non-NCCL) all-reduce kernels")


def _step_signals(out: list[Signal], st: pd.DataFrame) -> None:
    if st.empty:
        return
    if "excluded" in st:
        n_all = len(st)
        st = steps.included(st)
        _sig(out, "trace_steps_excluded_count", n_all - len(st), "count",
             "steps excluded as warm-up or profiler start/stop artefacts (not in any step signal)")
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
        blk = st["sync_blocking_us"] if "sync_blocking_us" in st else st["sync_us"]
        _sig(out, "trace_sync_in_step_ms", blk.mean() / 1e3, "ms",
             "mean CPU time per step in host syncs and synchronous copies while the GPU was idle")
        _sig(out, "trace_sync_in_step_ratio", _ratio(blk.sum(), st["dur_us"].sum()), "ratio",
             "share of step time spent in host syncs and synchronous copies while the GPU was idle (the part "
             "of a sync during GPU work does not block it)")
        _sig(out, "trace_sync_overlap_gpu_busy_ratio", _ratio(st["sync_us"].sum() - blk.sum(), st["sync_us"].sum()),
             "ratio", "share of in-step sync time during which the GPU was busy")
        _sig(out, "trace_sync_blocking_steps_count", int((blk > 0.05 * st["dur_us"]).sum()), "count",
             "steps whose syncs while the GPU was idle exceed 5% of the step")
    dec = st[st["step_type"] == "decode"]
    if not dec.empty:
        _sig(out, "trace_decode_step_p50_ms", dec["dur_us"].median() / 1e3, "ms", "median decode-step duration")
        if dec["kernel_us"].notna().any():
            _sig(out, "trace_decode_memory_bound_ratio", _ratio(dec["memory_bound_us"].sum(),
                                                                 dec["kernel_us"].sum()), "ratio",
                 "decode-step kernel time in memory-bound classes (memcpy/memset, norm/elementwise, attention, "
                 "sampling) and in GEMMs memory-bound by their shapes on the trace's device (trace/gemm.py)")
            if "attention_us" in dec:
                _sig(out, "trace_decode_attention_ratio", _ratio(dec["attention_us"].sum(), dec["kernel_us"].sum()),
                     "ratio", "decode-step kernel time in attention kernels")
    mix = st[st["step_type"] == "mixed"]
    if len(mix) and mix["prefill_tokens"].sum() > 0:
        _sig(out, "trace_mixed_prefill_tokens_p50_tokens", mix["prefill_tokens"].median(), "tokens",
             "median prefill tokens carried by a mixed step")
    if len(mix) >= 2 and len(dec) >= 2:
        _sig(out, "trace_mixed_step_inflation_ratio", mix["dur_us"].median() / dec["dur_us"].median(), "ratio",
             "median mixed (prefill+decode) step duration over median pure decode step duration")


def _stall_signals(out: list[Signal], hs: pd.DataFrame, st: pd.DataFrame) -> None:
    """Host stalls inside the counted steps (diagnose/trace/host_stall.py): a step's stall counts when it is at
    least STALL_STEP_MIN_SHARE of the step's CPU duration."""
    st = steps.included(st)
    if hs.empty or st.empty:
        return
    d = hs.merge(st[["rank", "step", "dur_us"]], on=["rank", "step"], how="inner")
    if d.empty:
        return
    big = d[d["stall_us"] >= STALL_STEP_MIN_SHARE * d["dur_us"]]
    frame = str(big["frame"].value_counts().index[0]) if len(big) and big["frame"].astype(bool).any() else ""
    where = f", opening inside {frame}" if frame else ""
    _sig(out, "trace_host_stall_p50_ms", d["stall_us"].median() / 1e3, "ms",
         f"the longest host stall per step (GPU idle until the CPU called the next launch), median{where}")
    _sig(out, "trace_host_stall_step_ratio", _ratio(float(d["stall_us"].sum()), float(st["dur_us"].sum())), "ratio",
         "the steps' longest host stalls over the steps' CPU duration")
    _sig(out, "trace_host_stall_steps_count", len(big), "count",
         f"steps whose longest host stall is at least {STALL_STEP_MIN_SHARE:.0%} of the step")
    if len(big):
        _sig(out, "trace_host_stall_untraced_ratio", float(big["untraced"].astype(bool).mean()), "ratio",
             "share of those stalls in which the trace recorded no CPU op or runtime call (native code or a GIL "
             "wait: untraced)")
        _sig(out, "trace_host_stall_eager_steps_count", int((big["graph_replays"].fillna(0) == 0).sum()), "count",
             "of those steps, the ones that ran eagerly (no graph replay): a stall there is no graph-mode matter")
