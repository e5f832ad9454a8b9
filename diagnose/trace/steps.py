"""Serving structure: engine steps from user annotations (vLLM, SGLang, ProfilerStep) and their GPU use."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from diagnose.trace.timeline import union_len

# vLLM: execute_context_1(200)_generation_0(0), execute_32_context_0(sq0sk0..)_generation_32(sq32sk55086..)
_VLLM = re.compile(r"^execute(?:_\d+)?_context_(\d+)\(([^)]*)\)_generation_(\d+)\(([^)]*)\)")
# SGLang: step[DECODE bs=32], step[EXTEND bs=4], step[MIXED ...]
_SGLANG = re.compile(r"^step\[(\w+)(?:[^\]]*?bs=(\d+))?")
_PROFSTEP = re.compile(r"^ProfilerStep#(\d+)")
_SGLANG_TYPES = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "mixed", "IDLE": "idle"}
MEMORY_BOUND_CLASSES = ("memory", "norm_elementwise", "attention", "sampling")


def _tokens(spec: str) -> int:
    m = re.search(r"sq(\d+)", spec) or re.search(r"(\d+)", spec)
    return int(m.group(1)) if m else 0


def parse_step_name(name: str) -> dict[str, Any] | None:
    """Step fields from an annotation name, or None when it is not a step annotation."""
    m = _VLLM.match(name)
    if m:
        pr, pt, dr, dt = int(m.group(1)), _tokens(m.group(2)), int(m.group(3)), _tokens(m.group(4))
        kind = "mixed" if pr and dr else "prefill" if pr else "decode" if dr else "idle"
        return {"source": "vllm", "step_type": kind, "prefill_reqs": pr, "prefill_tokens": pt,
                "decode_reqs": dr, "decode_tokens": dt}
    m = _SGLANG.match(name)
    if m:
        kind = _SGLANG_TYPES.get(m.group(1).upper(), "unknown")
        bs = int(m.group(2)) if m.group(2) else 0
        return {"source": "sglang", "step_type": kind, "prefill_reqs": bs if kind == "prefill" else 0,
                "prefill_tokens": 0, "decode_reqs": bs if kind == "decode" else 0,
                "decode_tokens": bs if kind == "decode" else 0}
    m = _PROFSTEP.match(name)
    if m:
        return {"source": "profiler_step", "step_type": "step", "prefill_reqs": 0, "prefill_tokens": 0,
                "decode_reqs": 0, "decode_tokens": 0}
    return None


def find_steps(annotations: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One row per engine step (CPU-side annotation), the most specific source only."""
    ann = annotations[annotations["where"] == "cpu"]
    cols = ["rank", "step", "source", "step_type", "ts_us", "dur_us", "prefill_reqs", "prefill_tokens",
            "decode_reqs", "decode_tokens"]
    if ann.empty:
        return pd.DataFrame(columns=cols)
    names = ann["name"].astype(str)
    parsed = {n: parse_step_name(n) for n in pd.unique(names.to_numpy())}
    rows = []
    for name, ts, dur in zip(names.to_numpy(), ann["ts_us"].to_numpy(), ann["dur_us"].to_numpy(), strict=True):
        p = parsed[name]
        if p is not None:
            rows.append({"ts_us": ts, "dur_us": dur, **p})
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    best = next(s for s in ("vllm", "sglang", "profiler_step") if (df["source"] == s).any())
    df = df[df["source"] == best].sort_values("ts_us", ignore_index=True)
    df.insert(0, "step", np.arange(len(df)))
    df.insert(0, "rank", rank)
    return df[cols]


def step_gpu_use(steps: pd.DataFrame, gpu: pd.DataFrame, cls: pd.Series, launch_ts: np.ndarray,
                 sync: tuple[np.ndarray, np.ndarray] | None) -> pd.DataFrame:
    """Adds per-step GPU use, memory-bound kernel time, host-sync time and the CPU gap before each step.

    A kernel belongs to the step whose CPU interval contains the start of the runtime call that launched it.
    ``gpu_busy_ratio`` = union of the step's kernel intervals / the step's GPU span (step start to the later of
    the step end and its last kernel end).
    """
    out = steps.copy()
    n = len(out)
    st = out["ts_us"].to_numpy(dtype=float)
    en = st + out["dur_us"].to_numpy(dtype=float)
    gap = np.full(n, np.nan)
    if n > 1:
        gap[1:] = st[1:] - np.maximum.accumulate(en)[:-1]
    out["cpu_gap_before_us"] = gap
    # host sync / synchronous copies inside each step (CPU time, clipped to the step)
    ss, se = sync if sync is not None else (np.zeros(0), np.zeros(0))
    sync_us = np.zeros(n) if sync is not None else np.full(n, np.nan)
    if len(ss):
        for i in range(n):
            sync_us[i] = float(np.clip(np.minimum(se, en[i]) - np.maximum(ss, st[i]), 0, None).sum())
    out["sync_us"] = sync_us
    out["gpu_busy_us"] = np.nan
    out["kernel_us"] = np.nan
    out["memory_bound_us"] = np.nan
    out["gpu_busy_ratio"] = np.nan
    out["gpu_span_us"] = np.nan
    if gpu.empty or n == 0:
        return out
    k = np.searchsorted(st, launch_ts, side="right") - 1
    ok = np.isfinite(launch_ts) & (k >= 0)
    ok[ok] &= launch_ts[ok] <= en[k[ok]]
    gs = gpu["ts_us"].to_numpy()
    ge = gs + gpu["dur_us"].to_numpy()
    c = cls.to_numpy()
    mb = np.isin(c, MEMORY_BOUND_CLASSES)
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return out
    kk = k[idx]
    order = np.argsort(kk, kind="stable")
    idx, kk = idx[order], kk[order]
    bounds = np.flatnonzero(np.r_[True, kk[1:] != kk[:-1], True])
    busy = np.zeros(n)
    kern = np.zeros(n)
    memb = np.zeros(n)
    gpu_end = np.zeros(n)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        sel = idx[a:b]
        step = kk[a]
        busy[step] = union_len(gs[sel], ge[sel])
        gpu_end[step] = ge[sel].max()
        d = ge[sel] - gs[sel]
        kern[step] = d.sum()
        memb[step] = d[mb[sel]].sum()
    has = np.zeros(n, dtype=bool)
    has[np.unique(kk)] = True
    out.loc[has, "gpu_busy_us"] = busy[has]
    out.loc[has, "kernel_us"] = kern[has]
    out.loc[has, "memory_bound_us"] = memb[has]
    # the step's GPU span: from the step start to whichever ends last, the CPU step or its kernels (kernels
    # of a graph replay run after the CPU side has returned)
    span = np.maximum(en, gpu_end) - st
    out["gpu_span_us"] = np.where(has, span, np.nan)
    out.loc[has, "gpu_busy_ratio"] = np.where(span[has] > 0, busy[has] / span[has], np.nan)
    return out


def step_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step type: count, duration distribution, tokens per step, GPU busy share, CPU gap."""
    cols = ["step_type", "steps", "dur_ms_mean", "dur_ms_p50", "dur_ms_p99", "tokens_mean",
            "gpu_busy_ratio_mean", "cpu_gap_ms_p50", "sync_ms_mean"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for kind, g in steps.groupby("step_type", sort=True):
        d = g["dur_us"].to_numpy(dtype=float) / 1e3
        toks = (g["prefill_tokens"] + g["decode_tokens"]).to_numpy(dtype=float)
        gaps = g["cpu_gap_before_us"].dropna().to_numpy(dtype=float) / 1e3
        rows.append({"step_type": kind, "steps": len(g), "dur_ms_mean": float(d.mean()),
                     "dur_ms_p50": float(np.percentile(d, 50)), "dur_ms_p99": float(np.percentile(d, 99)),
                     "tokens_mean": float(toks.mean()),
                     "gpu_busy_ratio_mean": float(g["gpu_busy_ratio"].mean()) if g["gpu_busy_ratio"].notna().any()
                     else np.nan,
                     "cpu_gap_ms_p50": float(np.percentile(gaps, 50)) if len(gaps) else np.nan,
                     "sync_ms_mean": float(g["sync_us"].mean() / 1e3) if g["sync_us"].notna().any() else np.nan})
    return pd.DataFrame(rows, columns=cols)
