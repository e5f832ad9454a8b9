"""The two halves of every trace analysis, shared by the single-process path (``analyze_files``) and the
scale-out path (diagnose/trace/distributed.py), so that both give the same result:

- :func:`reduce_file`: one rank's trace -> a :class:`RankResult` (its small per-rank tables, its rows for the
  one-row-per-rank tables, the start and duration of its communication kernels, and what the summary needs).
  The trace's event columns are freed when it returns: a result is a few kB to a few MB, whatever the trace.
- :func:`merge`: the results of every rank (in file order) -> the analysis's tables, warnings and summary,
  including the cross-rank ones (:func:`collective_skew`: skew, stragglers, collective wait vs transfer).

A rank whose trace cannot be read is a :class:`RankResult` with ``error`` set: the merge leaves it out and
counts it in one warning naming each file and its reason (only when every rank failed is it an error).
"""

from __future__ import annotations

import warnings as _warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np
import pandas as pd

from diagnose.errors import DiagnoseError, InputError
from diagnose.trace import capture, gemm, host_stall, launch, steps, timeline
from diagnose.trace.classify import classify_kernels
from diagnose.trace.parse import RankTrace, read_trace

SUMMARY_COLUMNS = ["files", "ranks", "events", "gpu", "steps", "include_python", "analysis_s"]
RANK_COLUMNS = ["rank", "file", "events", "time_unit", "base_time_ns", "start_us", "end_us"]
# per-rank tables (key in RankResult.tables -> the merged table); concatenated in file order
TABLES = {"streams": "trace_gpu_streams", "idle_streams": "trace_idle_streams", "classes": "trace_kernel_classes",
          "top": "trace_top_kernels", "launch": "trace_launch", "sync": "trace_sync",
          "transfers": "trace_transfers", "steps": "trace_steps", "cpu_ops": "trace_cpu_ops",
          "python": "trace_python_functions", "comm": "trace_comm_split", "stalls": "trace_host_stalls",
          "gemm": "trace_gemm"}
# one row per rank (key in RankResult.rows -> the merged table)
ROWS = {"gpu_row": "trace_gpu_time", "idle_row": "trace_idle", "launch_row": "trace_launch_summary"}
TIE_US = 5.0  # ranks whose starts of a collective lie within this of the earliest one tie: nobody is last
MERGED_ORDER = ["trace_gpu_time", "trace_gpu_streams", "trace_idle", "trace_idle_streams", "trace_kernel_classes",
                "trace_top_kernels", "trace_launch", "trace_launch_summary", "trace_sync", "trace_transfers",
                "trace_steps", "trace_cpu_ops", "trace_gemm"]


class ScaleOutInfo(TypedDict):
    """Where a scale-out ran the ranks (trace/distributed.py reduce_files)."""

    scheduler: str
    local: bool
    workers: int
    worker_peak_rss_bytes: list[int]
    results_dir: str | None


class TraceSummary(TypedDict, total=False):
    """What the analysis read (``merge``; ``TraceAnalysis.summary``): files, ranks, metadata, event categories.
    Every key is set by ``merge`` but ``scale_out`` (a scale-out's); empty before an analysis."""

    files: list[str]
    ranks: list[int]
    events: int
    gpu: bool
    devices: list[str]
    time_unit: list[str]
    categories: dict[str, int]
    meta: dict[int, Mapping[str, Any]]  # per rank, its trace header's metadata (parse._small_meta)
    include_python: bool
    steps: int
    analysis_s: float
    span_us: dict[int, tuple[float, float]]
    failed: dict[str, str | None]
    scale_out: NotRequired[ScaleOutInfo]


@dataclass
class RankResult:
    """What one rank's trace reduces to. ``rank`` is the rank the file declares (``distributedInfo.rank``;
    ``has_rank`` False when it declares none); :func:`merge` assigns the final one."""

    index: int  # position in the file list
    path: Path
    rank: int = 0
    has_rank: bool = False
    error: str | None = None  # the one-line reason the trace could not be read
    meta: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    unit: str = "us"
    categories: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    span_us: tuple[float, float] | None = None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # one row per rank of the tables in ROWS: timeline.gpu_time's, timeline.idle_attribution's, launch.launch_stats'
    rows: dict[str, timeline.GpuTimeRow | launch.LaunchSummary | dict[str, float]] = field(default_factory=dict)
    capture: bool = False  # the trace records a graph capture, not serving
    comm_ts_us: np.ndarray | None = None  # starts of the communication kernels (None: no GPU events)
    comm_dur_us: np.ndarray | None = None
    comm_pre_idle_us: np.ndarray | None = None  # the GPU's idle time just before each of them (NaN: none before)


def kernel_tables(rt: RankTrace, cls: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-class and per-kernel-name time (count, total, mean, P99)."""
    g = rt.gpu
    total = float(g["dur_us"].sum())
    df = pd.DataFrame({"name": g["name"], "class": cls, "dur_us": g["dur_us"]})
    by_cls = df.groupby("class", observed=True)["dur_us"]
    classes = pd.DataFrame({"count": by_cls.size(), "total_ms": by_cls.sum() / 1e3, "mean_us": by_cls.mean(),
                            "p99_us": by_cls.quantile(0.99)}).reset_index()
    classes["share_ratio"] = classes["total_ms"] * 1e3 / total if total > 0 else np.nan
    classes.insert(0, "rank", rt.rank)
    by_name = df.groupby("name", observed=True)
    top = pd.DataFrame({"class": by_name["class"].first(), "count": by_name["dur_us"].size(),
                        "total_ms": by_name["dur_us"].sum() / 1e3, "mean_us": by_name["dur_us"].mean()})
    top = top.sort_values("total_ms", ascending=False).head(25)
    sub = df[df["name"].isin(top.index)]
    top["p99_us"] = sub.groupby("name", observed=True)["dur_us"].quantile(0.99).reindex(top.index)
    top["share_ratio"] = top["total_ms"] * 1e3 / total if total > 0 else np.nan
    top = top.reset_index()
    top["name"] = top["name"].astype(str).str.slice(0, 200)
    top.insert(0, "rank", rt.rank)
    return classes.sort_values("total_ms", ascending=False, ignore_index=True), top


def cpu_op_table(rt: RankTrace, top: int = 25) -> pd.DataFrame:
    c = rt.cpu_ops
    if c.empty:
        return pd.DataFrame(columns=["rank", "name", "count", "total_ms", "mean_us", "max_us"])
    g = c.groupby("name", observed=True)["dur_us"].agg(["size", "sum", "mean", "max"])
    g = g.sort_values("sum", ascending=False).head(top).reset_index()
    return pd.DataFrame({"rank": rt.rank, "name": g["name"].astype(str).str.slice(0, 200), "count": g["size"],
                         "total_ms": g["sum"] / 1e3, "mean_us": g["mean"], "max_us": g["max"]})


def reduce_rank(rt: RankTrace, index: int = 0) -> RankResult:
    """Every per-rank analysis of one parsed trace."""
    out = RankResult(index=index, path=rt.path, rank=rt.rank,
                     has_rank="distributedInfo" in rt.meta,
                     meta=rt.meta, events=rt.events_total, unit=rt.time_unit, categories=rt.categories,
                     warnings=list(rt.warnings))
    t = out.tables
    t["cpu_ops"] = cpu_op_table(rt)
    if rt.python is not None:
        t["python"] = cpu_op_table(RankTrace(path=rt.path, rank=rt.rank, meta={}, gpu=rt.gpu, runtime=rt.runtime,
                                             cpu_ops=rt.python, annotations=rt.annotations, python=None))
    spans = [(float(f["ts_us"].min()), float((f["ts_us"] + f["dur_us"]).max()))
             for f in (rt.gpu, rt.runtime, rt.cpu_ops, rt.annotations) if len(f)]
    if spans:
        out.span_us = (min(a for a, _ in spans), max(b for _, b in spans))
    cls = classify_kernels(rt.gpu)
    launch_ts, launch_end = timeline.launch_call_for(rt.gpu, rt.runtime)
    sync = launch.sync_intervals(rt.runtime) if not rt.runtime.empty else None
    pre: tuple[np.ndarray, np.ndarray] | None = None
    graph = timeline.graph_kernels(rt.gpu)
    if not rt.gpu.empty:
        t["idle_streams"], out.rows["idle_row"], pre = timeline.idle_attribution(
            rt.gpu, launch_ts, rt.rank, launch_end, timeline.graph_follower(rt.gpu, rt.runtime), graph)
    cap = capture.capture_intervals(rt.annotations, rt.step_frames, rt.runtime)
    st = steps.find_steps(steps.with_op_profiler_steps(rt.annotations, rt.cpu_ops), rt.rank, rt.step_frames)
    device = next((d for d in rt.meta.get("devices", []) if d), "")
    mem_gemm = gemm.memory_bound_gemms(rt.cpu_ops, rt.gpu, rt.runtime, cls.to_numpy() == "gemm", device)
    t["steps"] = steps.mark_artefacts(steps.step_gpu_use(st, rt.gpu, cls, launch_ts, sync, pre, graph, mem_gemm),
                                      rt.runtime, cap)
    # a capture pass: the trace records graphs and no counted step serves (steps that capture are excluded)
    out.capture = bool(len(cap[0])) and steps.included(t["steps"]).empty
    cpu_ann = rt.annotations[rt.annotations["where"] == "cpu"] if len(rt.annotations) else None
    t["stalls"] = host_stall.host_stalls(t["steps"], rt.gpu, launch_ts, rt.runtime,
                                         [cpu_ann, rt.cpu_ops, rt.step_frames, rt.python], pre)
    keep_gpu, keep_rt = steps.outside_artefacts(t["steps"], launch_ts, rt.runtime)
    if not out.capture and not (keep_gpu.all() and keep_rt.all()):  # a capture pass keeps its whole window
        # the window-level analyses leave out the excluded steps (warm-up, profiler start/stop): their
        # kernels and runtime calls, so the window shrinks to the counted steps' activity
        rt = replace(rt, gpu=rt.gpu[keep_gpu].reset_index(drop=True),
                     runtime=rt.runtime[keep_rt].reset_index(drop=True))
        cls = classify_kernels(rt.gpu)
        launch_ts, launch_end = timeline.launch_call_for(rt.gpu, rt.runtime)
        graph = timeline.graph_kernels(rt.gpu)
        t.pop("idle_streams", None)
        out.rows.pop("idle_row", None)
        if not rt.gpu.empty:
            t["idle_streams"], out.rows["idle_row"], _ = timeline.idle_attribution(
                rt.gpu, launch_ts, rt.rank, launch_end, timeline.graph_follower(rt.gpu, rt.runtime), graph)
    t["sync"] = launch.sync_calls(rt.runtime, rt.rank) if not rt.runtime.empty else pd.DataFrame()
    if rt.gpu.empty:
        return out
    out.rows["gpu_row"], t["streams"] = timeline.gpu_time(rt.gpu, cls, rt.rank)
    t["comm"] = timeline.comm_split(rt.gpu, cls, rt.rank, timeline.first_comm_of_step(rt.gpu, cls, launch_ts, st))
    t["classes"], t["top"] = kernel_tables(rt, cls)
    t["gemm"] = gemm.gemm_table(rt.cpu_ops, rt.gpu, rt.runtime, cls.to_numpy() == "gemm", rt.rank, device)
    t["launch"], out.rows["launch_row"] = launch.launch_stats(rt.gpu, rt.runtime, rt.rank)
    t["transfers"] = launch.transfers(rt.gpu, rt.runtime, rt.rank)
    comm = cls.to_numpy() == "communication"
    out.comm_ts_us = rt.gpu["ts_us"].to_numpy()[comm]
    out.comm_dur_us = rt.gpu["dur_us"].to_numpy()[comm]
    out.comm_pre_idle_us = idle_before(rt.gpu["ts_us"].to_numpy(float), rt.gpu["dur_us"].to_numpy(float))[comm]
    return out


def idle_before(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per kernel, how long the whole device had been idle when it started: its start minus the latest end
    of the kernels (any stream) that started before it, never negative; NaN for the first kernel."""
    out = np.full(len(ts), np.nan)
    if len(ts) < 2:
        return out
    order = np.argsort(ts, kind="stable")
    prev_end = np.maximum.accumulate((ts + dur)[order])
    gap = np.concatenate([[np.nan], np.clip(ts[order][1:] - prev_end[:-1], 0.0, None)])
    out[order] = gap
    return out


def reduce_file(path: Path, index: int = 0, *, include_python: bool = False) -> RankResult:
    """Read one rank's trace and reduce it; a trace that cannot be read gives a result with ``error`` set."""
    try:
        rt = read_trace(path, include_python=include_python)
    except DiagnoseError as e:
        return RankResult(index=index, path=path, error=str(e))
    return reduce_rank(rt, index)


def _relabel(r: RankResult, rank: int) -> None:
    """Give a result its final rank (every per-rank table and row carries it)."""
    if rank == r.rank:
        return
    r.rank = rank
    for k, df in r.tables.items():
        if "rank" in df.columns and len(df):
            df = df.copy()
            df["rank"] = rank
            r.tables[k] = df
    for row in r.rows.values():
        row["rank"] = rank


def assign_ranks(results: Sequence[RankResult], n_files: int) -> dict[int, str]:
    """The rank of each result, in file order: the declared one, else the file's position; a rank already
    seen becomes the next free one (with a warning, by the result's index)."""
    warnings: dict[int, str] = {}
    seen: set[int] = set()
    for r in sorted(results, key=lambda r: r.index):
        rank = r.rank
        if n_files > 1 and rank in seen:
            new = max(seen) + 1
            warnings[r.index] = f"{r.path.name}: rank {rank} already seen; analysed as rank {new}"
            rank = new
        elif n_files > 1 and not r.has_rank:
            rank = r.index if r.index not in seen else max(seen) + 1
        seen.add(rank)
        _relabel(r, rank)
    return warnings


def _concat(parts: list[pd.DataFrame | None]) -> pd.DataFrame:
    kept = [p for p in parts if p is not None and not p.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()


def failed_warning(failed: Sequence[RankResult], n_files: int) -> str:
    return (f"{len(failed)} of {n_files} rank traces could not be read and were left out: "
            + "; ".join(r.error or r.path.name for r in failed))


def merge(results: Sequence[RankResult], *, n_files: int, include_python: bool = False,
          notes: Sequence[str] = ()) -> tuple[dict[str, pd.DataFrame], list[str], TraceSummary]:
    """The analysis's tables, warnings and summary from every rank's result (any order; file order is
    restored). ``analysis_s`` is left to the caller (0 here). Raises InputError when no rank could be read."""
    ordered = sorted(results, key=lambda r: r.index)
    failed = [r for r in ordered if r.error is not None]
    ok = [r for r in ordered if r.error is None]
    if not ok:
        if len(failed) == 1:
            raise InputError(failed[0].error or str(failed[0].path))
        raise InputError(f"none of the {n_files} rank traces could be read; first: {failed[0].error}")
    warnings: list[str] = []
    dup = assign_ranks(ok, n_files)
    for r in ok:  # a file's duplicate-rank warning comes before its own parse warnings
        if r.index in dup:
            warnings.append(dup[r.index])
        warnings.extend(r.warnings)
    tables: dict[str, pd.DataFrame] = {}
    by_table = {v: k for k, v in {**TABLES, **ROWS}.items()}
    for name in MERGED_ORDER:
        key = by_table[name]
        if key in ROWS:
            tables[name] = pd.DataFrame([r.rows[key] for r in ok if key in r.rows])
        else:
            tables[name] = _concat([r.tables.get(key) for r in ok])
    if include_python:
        tables["trace_python_functions"] = _concat([r.tables.get("python") for r in ok])
    tables["trace_step_summary"] = steps.step_summary(tables["trace_steps"])
    tables["trace_step_percentiles"] = steps.step_percentiles(tables["trace_steps"])
    tables["trace_graph_mode"] = steps.graph_mode_table(tables["trace_steps"])
    tables["trace_comm_split"] = _concat([r.tables.get("comm") for r in ok])
    tables["trace_host_stalls"] = _concat([r.tables.get("stalls") for r in ok])
    tables["trace_capture"] = pd.DataFrame({"rank": [r.rank for r in ok if r.capture]}, dtype="int64")
    comm = {r.rank: r.comm_ts_us for r in ok if r.comm_ts_us is not None}
    durs = {r.rank: r.comm_dur_us for r in ok if r.comm_dur_us is not None}
    idle = {r.rank: r.comm_pre_idle_us for r in ok if r.comm_pre_idle_us is not None}
    per_coll, per_rank, w = collective_skew(comm, durs, idle)
    warnings.extend(w)
    tables["trace_collectives"] = per_coll
    tables["trace_rank_skew"] = per_rank
    has_gpu = not tables["trace_gpu_time"].empty
    if not has_gpu:
        warnings.append("no GPU events in the trace (CPU-only, e.g. vLLM's CPU build): analysed CPU ops and "
                        "engine steps only")
    if not tables["trace_capture"].empty:
        warnings.append("this is a graph-capture trace, not serving (stream-capture calls, or capture "
                        "annotations / frames of vLLM, SGLang or Inductor): its idle and launch figures describe "
                        "the capture, not steps")
    if tables["trace_steps"].empty:
        warnings.append("no engine steps found (vLLM execute_context_* annotations or V1 execute_model frames, "
                        "SGLang step[...], or ProfilerStep#): per-step analysis skipped")
    if failed:
        warnings.append(failed_warning(failed, n_files))
    warnings.extend(notes)
    spans = {r.rank: r.span_us for r in ok if r.span_us is not None}
    tables["trace_ranks"] = pd.DataFrame([
        {"rank": r.rank, "file": str(r.path), "events": r.events, "time_unit": r.unit,
         "base_time_ns": r.meta.get("baseTimeNanoseconds") if isinstance(r.meta.get("baseTimeNanoseconds"), int)
         else None, "start_us": spans.get(r.rank, (np.nan, np.nan))[0],
         "end_us": spans.get(r.rank, (np.nan, np.nan))[1]}
        for r in ok], columns=RANK_COLUMNS).astype({"base_time_ns": "Int64"})
    tables["trace_devices"] = pd.DataFrame([{"rank": r.rank, "device": str(d)} for r in ok
                                            for d in r.meta.get("devices", []) if d], columns=["rank", "device"])
    tables["trace_warnings"] = pd.DataFrame({"message": pd.Series(warnings, dtype=object)})
    tables["trace_summary"] = pd.DataFrame([{
        "files": len(ok), "ranks": len({r.rank for r in ok}), "events": sum(r.events for r in ok),
        "gpu": has_gpu, "steps": len(tables["trace_steps"]), "include_python": include_python,
        "analysis_s": 0.0}], columns=SUMMARY_COLUMNS)
    summary: TraceSummary = {
        "files": [str(r.path) for r in ok], "ranks": sorted(r.rank for r in ok),
        "events": sum(r.events for r in ok), "gpu": has_gpu,
        "devices": sorted({d for r in ok for d in r.meta.get("devices", []) if d}),
        "time_unit": sorted({r.unit for r in ok}),
        "categories": _merge_counts([r.categories for r in ok]),
        "meta": {r.rank: r.meta for r in ok}, "include_python": include_python,
        "steps": len(tables["trace_steps"]), "analysis_s": 0.0, "span_us": spans,
        "failed": {str(r.path): r.error for r in failed},
    }
    return tables, warnings, summary


def _merge_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def collective_skew(comm_starts: dict[int, np.ndarray], comm_durs: dict[int, np.ndarray] | None = None,
                    pre_idle: dict[int, np.ndarray] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Match the i-th communication kernel of every rank; per collective: start skew and the last rank.

    Needs traces captured over the same window with comparable clocks (one host, or synchronised hosts). A
    collective whose starts all lie within TIE_US of each other has no last rank (``last_rank`` -1).
    With the kernels' durations, each rank's time in a collective splits into *wait* (from its own start to
    the last rank's start, capped at its duration: the collective cannot progress before every rank is in
    it) and *transfer* (the rest). With each rank's GPU idle before each of its collectives (``pre_idle``,
    :func:`idle_before`), ``pre_idle_us_p50`` per rank: a rank that starts late with its GPU idle was held up
    by its host; one whose GPU was busy right up to the collective was held up by GPU work. Returns (per
    collective, per rank, warnings).
    """
    warnings: list[str] = []
    ranks = sorted(r for r, a in comm_starts.items() if len(a))
    if len(ranks) < 2:
        return pd.DataFrame(), pd.DataFrame(), warnings
    counts = {r: len(comm_starts[r]) for r in ranks}
    n = min(counts.values())
    if len(set(counts.values())) > 1:
        warnings.append("ranks have different numbers of communication kernels "
                        f"({', '.join(f'rank {r}: {c}' for r, c in counts.items())}); matched the first {n}")
    order = {r: np.argsort(comm_starts[r], kind="stable")[:n] for r in ranks}
    m = np.stack([comm_starts[r][order[r]] for r in ranks])  # ranks x collectives
    earliest = m.min(axis=0)
    latest = m.max(axis=0)
    skew = latest - earliest
    last = np.where(skew > TIE_US, np.array(ranks)[m.argmax(axis=0)], -1)  # -1: a tie, no rank was last
    per_coll = pd.DataFrame({"collective": np.arange(n), "skew_us": skew, "last_rank": last})
    lag = m - earliest
    per_rank = pd.DataFrame({"rank": ranks, "collectives": n, "lag_us_mean": lag.mean(axis=1),
                             "lag_us_p50": np.percentile(lag, 50, axis=1),
                             "lag_us_p99": np.percentile(lag, 99, axis=1),
                             "times_last": [int((last == r).sum()) for r in ranks]})
    per_rank["last_share_ratio"] = per_rank["times_last"] / max(n, 1)
    if comm_durs is not None and all(r in comm_durs and len(comm_durs[r]) == counts[r] for r in ranks):
        d = np.stack([comm_durs[r][order[r]] for r in ranks])
        wait = np.clip(latest - m, 0.0, d)
        per_coll["wait_us_mean"] = wait.mean(axis=0)
        per_coll["transfer_us_mean"] = (d - wait).mean(axis=0)
        per_rank["comm_us"] = d.sum(axis=1)
        per_rank["wait_us"] = wait.sum(axis=1)
        per_rank["transfer_us"] = per_rank["comm_us"] - per_rank["wait_us"]
        tot = per_rank["comm_us"].to_numpy()
        per_rank["wait_ratio"] = np.divide(per_rank["wait_us"].to_numpy(), tot, out=np.full(len(tot), np.nan),
                                           where=tot > 0)
    if pre_idle is not None and all(r in pre_idle and len(pre_idle[r]) == counts[r] for r in ranks):
        gap = np.stack([pre_idle[r][order[r]] for r in ranks])
        with _warnings.catch_warnings():  # a rank whose every collective came first on its GPU: NaN
            _warnings.simplefilter("ignore", RuntimeWarning)
            per_rank["pre_idle_us_p50"] = np.nanpercentile(gap, 50, axis=1)
    return per_coll, per_rank, warnings
