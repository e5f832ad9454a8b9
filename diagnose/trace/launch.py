"""Kernel launch overhead (graph-aware), host synchronisation and memory transfers."""

from __future__ import annotations

import re
from typing import Any, NotRequired, TypedDict

import numpy as np
import pandas as pd

from diagnose.trace.classify import (
    GRAPH_LAUNCH,
    HOST_SYNC_CALLS,
    LAUNCH_CALLS,
    SYNC_COPY_CALLS,
    memcpy_direction,
)

_ASYNC = re.compile("Async")


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def _name_mask(names: pd.Series, pattern: Any) -> np.ndarray:
    cats = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else None
    if cats is None:
        return names.astype(str).str.contains(pattern).to_numpy()
    hit = np.array([bool(pattern.search(str(c))) for c in cats] + [False])
    codes = names.cat.codes.to_numpy()
    return hit[np.where(codes < 0, len(hit) - 1, codes)]


class LaunchRow(TypedDict):
    """One launch type (graph or kernel) of one rank: the ``trace_launch`` table's row."""

    rank: int
    launch: str  # "graph" | "kernel"
    calls: int
    kernels: int
    kernels_per_call_mean: float
    call_us_mean: float
    call_us_p50: float
    call_us_p99: float
    delay_us_p50: float
    delay_us_p99: float
    gpu_us_per_call_mean: float
    launch_bound_ratio: float


class LaunchSummary(TypedDict):
    """One rank's launch figures: the ``trace_launch_summary`` table's row."""

    rank: int
    kernels: int
    kernels_matched: int
    graph_launches: NotRequired[int]
    graph_kernels: NotRequired[int]
    eager_kernels: NotRequired[int]
    launch_bound_kernels: NotRequired[int]
    launch_bound_ratio: NotRequired[float]
    launch_call_p50_us: NotRequired[float]
    launch_delay_p50_us: NotRequired[float]
    kernel_dur_p50_us: NotRequired[float]


def launch_stats(gpu: pd.DataFrame, runtime: pd.DataFrame, rank: int) -> tuple[pd.DataFrame, LaunchSummary]:
    """Per launch type: CPU call time, launch-to-start delay, and the share of launch-bound kernels.

    Kernels are joined to the runtime call with the same correlation id. One graph launch
    (cudaGraphLaunch/hipGraphLaunch) runs many kernels under one correlation: only the first kernel of each
    graph launch gets a launch delay, and graph kernels are never compared one by one with the launch call
    (that comparison is the artefact the issue warns about).
    """
    kern = gpu[gpu["kind"] == "kernel"]
    rt = runtime[_name_mask(runtime["name"], LAUNCH_CALLS) & (runtime["corr"] >= 0)]
    rt = rt.drop_duplicates("corr")
    j = kern[["ts_us", "dur_us", "corr"]].merge(
        rt[["corr", "name", "ts_us", "dur_us"]].rename(columns={"name": "call", "ts_us": "call_ts_us",
                                                                "dur_us": "call_dur_us"}),
        on="corr", how="inner")
    rows: list[LaunchRow] = []
    summary: LaunchSummary = {"rank": rank, "kernels": len(kern), "kernels_matched": len(j)}
    if j.empty:
        return pd.DataFrame(rows), summary
    j["graph"] = _name_mask(j["call"].astype("category"), GRAPH_LAUNCH)
    per_corr = j.groupby("corr")["ts_us"].transform("size")
    j["graph"] |= per_corr.to_numpy() > 1
    j["delay_us"] = j["ts_us"] - (j["call_ts_us"] + j["call_dur_us"])
    for graph, grp in j.groupby("graph"):
        if graph:
            first = grp.sort_values("ts_us").groupby("corr").agg(
                start=("ts_us", "min"), end=("ts_us", "max"), call_ts=("call_ts_us", "first"),
                call_dur=("call_dur_us", "first"), kernels=("ts_us", "size"), gpu_us=("dur_us", "sum"))
            delay = (first["start"] - (first["call_ts"] + first["call_dur"])).to_numpy()
            calls = first["call_dur"].to_numpy()
            rows.append({"rank": rank, "launch": "graph", "calls": len(first), "kernels": int(first["kernels"].sum()),
                         "kernels_per_call_mean": float(first["kernels"].mean()),
                         "call_us_mean": float(calls.mean()), "call_us_p50": _pct(calls, 50),
                         "call_us_p99": _pct(calls, 99), "delay_us_p50": _pct(delay, 50),
                         "delay_us_p99": _pct(delay, 99), "gpu_us_per_call_mean": float(first["gpu_us"].mean()),
                         "launch_bound_ratio": float((first["gpu_us"] < first["call_dur"]).mean())})
            summary["graph_launches"] = len(first)
            summary["graph_kernels"] = int(first["kernels"].sum())
        else:
            calls = grp["call_dur_us"].to_numpy()
            delay = grp["delay_us"].to_numpy()
            dur = grp["dur_us"].to_numpy()
            bound = dur < calls
            rows.append({"rank": rank, "launch": "kernel", "calls": len(grp), "kernels": len(grp),
                         "kernels_per_call_mean": 1.0, "call_us_mean": float(calls.mean()),
                         "call_us_p50": _pct(calls, 50), "call_us_p99": _pct(calls, 99),
                         "delay_us_p50": _pct(delay, 50), "delay_us_p99": _pct(delay, 99),
                         "gpu_us_per_call_mean": float(dur.mean()), "launch_bound_ratio": float(bound.mean())})
            summary.update({"eager_kernels": len(grp), "launch_bound_kernels": int(bound.sum()),
                            "launch_bound_ratio": float(bound.mean()), "launch_call_p50_us": _pct(calls, 50),
                            "launch_delay_p50_us": _pct(delay, 50), "kernel_dur_p50_us": _pct(dur, 50)})
    return pd.DataFrame(rows), summary


def sync_calls(runtime: pd.DataFrame, rank: int) -> pd.DataFrame:
    """CPU time in host synchronisation and synchronous copy/set calls, per call name."""
    m = _name_mask(runtime["name"], HOST_SYNC_CALLS) | _name_mask(runtime["name"], SYNC_COPY_CALLS)
    sub = runtime[m]
    if sub.empty:
        return pd.DataFrame(columns=["rank", "call", "kind", "count", "total_ms", "max_ms"])
    g = sub.groupby(sub["name"].astype(str))["dur_us"].agg(["size", "sum", "max"]).reset_index()
    g.columns = ["call", "count", "total_us", "max_us"]
    g["kind"] = np.where(g["call"].str.contains("Synchronize"), "sync", "sync_copy")
    return pd.DataFrame({"rank": rank, "call": g["call"], "kind": g["kind"], "count": g["count"],
                         "total_ms": g["total_us"] / 1e3, "max_ms": g["max_us"] / 1e3}).sort_values(
        "total_ms", ascending=False, ignore_index=True)


def sync_intervals(runtime: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    m = _name_mask(runtime["name"], HOST_SYNC_CALLS) | _name_mask(runtime["name"], SYNC_COPY_CALLS)
    sub = runtime[m]
    s = sub["ts_us"].to_numpy()
    return s, s + sub["dur_us"].to_numpy()


def transfers(gpu: pd.DataFrame, runtime: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Memcpy/memset activity by direction: count, bytes, time, bandwidth, pageable and async-pageable."""
    mem = gpu[gpu["kind"] != "kernel"]
    cols = ["rank", "direction", "count", "bytes", "total_us", "bandwidth_gbps", "pageable", "async_pageable",
            "async_pageable_us"]
    if mem.empty:
        return pd.DataFrame(columns=cols)
    cats = [str(c) for c in mem["name"].cat.categories]
    codes = mem["name"].cat.codes.to_numpy()
    direction = np.array([memcpy_direction(c) for c in cats], dtype=object)[codes]
    pageable = np.array(["Pageable" in c for c in cats], dtype=bool)[codes]
    calls = runtime[runtime["corr"] >= 0][["corr", "name"]].drop_duplicates("corr")
    calls = calls.assign(is_async=_name_mask(calls["name"], _ASYNC))[["corr", "is_async"]]
    async_call = mem[["corr"]].merge(calls, on="corr", how="left")["is_async"].fillna(False).to_numpy(dtype=bool)
    df = pd.DataFrame({"direction": direction, "bytes": mem["bytes"].clip(lower=0).to_numpy(),
                       "dur": mem["dur_us"].to_numpy(), "pageable": pageable, "async_pageable": pageable & async_call})
    df["async_pageable_dur"] = np.where(df["async_pageable"], df["dur"], 0.0)
    g = df.groupby("direction").agg(count=("dur", "size"), bytes=("bytes", "sum"), total_us=("dur", "sum"),
                                    pageable=("pageable", "sum"), async_pageable=("async_pageable", "sum"),
                                    async_pageable_us=("async_pageable_dur", "sum"))
    g = g.reset_index()
    g["bandwidth_gbps"] = np.where(g["total_us"] > 0, g["bytes"] / (g["total_us"] * 1e3), np.nan)
    g.loc[g["direction"] == "memset", "bandwidth_gbps"] = np.nan
    g.insert(0, "rank", rank)
    return g[cols]
