"""analyze_trace: one trace file or a directory of per-rank traces -> tables (docs/trace-analysis.md), and the
signals computed from them (diagnose/trace/signals.py). Report sections are built from the same tables by
reports/sections/trace.py.

Besides the analyses' tables, every result has ``trace_summary`` (one row: ``files, ranks, events, gpu, steps,
include_python, analysis_s``), ``trace_ranks`` (one row per rank: ``rank, file, events, time_unit,
base_time_ns`` (the trace's ``baseTimeNanoseconds``, null when absent), ``start_us, end_us`` (first and last
event)), ``trace_devices`` (``rank, device``) and ``trace_warnings`` (``message``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagnose.errors import InputError
from diagnose.model import Signal
from diagnose.trace import launch, steps, timeline
from diagnose.trace.classify import classify_kernels
from diagnose.trace.multirank import collective_skew
from diagnose.trace.parse import RankTrace, read_trace
from diagnose.trace.signals import trace_signals

TRACE_SUFFIXES = (".json", ".json.gz")


SUMMARY_COLUMNS = ["files", "ranks", "events", "gpu", "steps", "include_python", "analysis_s"]
RANK_COLUMNS = ["rank", "file", "events", "time_unit", "base_time_ns", "start_us", "end_us"]


@dataclass
class TraceAnalysis:
    """The tables of one analysis; ``summary`` describes the input (files, metadata, event categories) for
    the report's environment part."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def signals(self) -> list[Signal]:
        return trace_signals(self.tables)


def trace_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such trace file or directory")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise InputError(f"{p}: directory holds no trace files (*.json, *.json.gz)")
    return files


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


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


def _analyze_rank(rt: RankTrace) -> dict[str, Any]:
    out: dict[str, Any] = {"rank": rt.rank, "cpu_ops": cpu_op_table(rt)}
    if rt.python is not None:
        out["python"] = cpu_op_table(RankTrace(path=rt.path, rank=rt.rank, meta={}, gpu=rt.gpu, runtime=rt.runtime,
                                               cpu_ops=rt.python, annotations=rt.annotations, python=None))
    spans = [(float(f["ts_us"].min()), float((f["ts_us"] + f["dur_us"]).max()))
             for f in (rt.gpu, rt.runtime, rt.cpu_ops, rt.annotations) if len(f)]
    if spans:
        out["span_us"] = (min(a for a, _ in spans), max(b for _, b in spans))
    cls = classify_kernels(rt.gpu)
    launch_ts, launch_end = timeline.launch_call_for(rt.gpu, rt.runtime)
    sync = launch.sync_intervals(rt.runtime) if not rt.runtime.empty else None
    pre: tuple[np.ndarray, np.ndarray] | None = None
    graph = timeline.graph_kernels(rt.gpu)
    if not rt.gpu.empty:
        out["idle_streams"], out["idle_row"], pre = timeline.idle_attribution(
            rt.gpu, launch_ts, rt.rank, launch_end, timeline.graph_follower(rt.gpu, rt.runtime), graph)
    out["capture"] = steps.is_capture(rt.annotations, rt.step_frames)
    st = steps.find_steps(rt.annotations, rt.rank, rt.step_frames)
    out["steps"] = steps.step_gpu_use(st, rt.gpu, cls, launch_ts, sync, pre, graph)
    out["sync"] = launch.sync_calls(rt.runtime, rt.rank) if not rt.runtime.empty else pd.DataFrame()
    if rt.gpu.empty:
        return out
    out["gpu_row"], out["streams"] = timeline.gpu_time(rt.gpu, cls, rt.rank)
    out["comm"] = timeline.comm_split(rt.gpu, cls, rt.rank, timeline.first_comm_of_step(rt.gpu, cls, launch_ts, st))
    out["classes"], out["top"] = kernel_tables(rt, cls)
    out["launch"], out["launch_row"] = launch.launch_stats(rt.gpu, rt.runtime, rt.rank)
    out["transfers"] = launch.transfers(rt.gpu, rt.runtime, rt.rank)
    comm = cls.to_numpy() == "communication"
    out["comm_starts"] = rt.gpu["ts_us"].to_numpy()[comm]
    return out


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if p is not None and not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def analyze_trace(path: str | Path, *, include_python: bool = False) -> TraceAnalysis:
    """Analyse a trace file (.json/.json.gz) or a directory of per-rank traces.

    Bad input raises :class:`diagnose.errors.InputError` with a one-line message naming the file.
    """
    files = trace_files(path)
    frontend = [f for f in files if "async_llm" in f.name]
    if frontend and len(frontend) < len(files):  # vLLM's profiler dir: API-server traces next to the workers
        msg = ("skipped the API-server trace(s) " + ", ".join(f.name for f in frontend)
               + " (vLLM frontend: no kernels, no engine steps); analyse one alone by passing its file")
        return analyze_files([f for f in files if f not in frontend], include_python=include_python, notes=[msg])
    return analyze_files(files, include_python=include_python)


def analyze_files(files: list[Path], *, include_python: bool = False, notes: Sequence[str] = ()) -> TraceAnalysis:
    """Analyse the given per-rank trace files together (one rank each); ``notes`` are warnings about the
    input from the caller, kept after the analysis's own."""
    t0 = time.perf_counter()
    warnings: list[str] = []
    results: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []  # per file: what the summary needs once its columns are freed
    seen: set[int] = set()
    for i, f in enumerate(files):
        rt = read_trace(f, include_python=include_python)
        if len(files) > 1 and rt.rank in seen:
            new = max(seen) + 1
            warnings.append(f"{f.name}: rank {rt.rank} already seen; analysed as rank {new}")
            rt.rank = new
        elif len(files) > 1 and "distributedInfo" not in rt.meta:
            rt.rank = i if i not in seen else max(seen) + 1
        seen.add(rt.rank)
        warnings.extend(rt.warnings)
        results.append(_analyze_rank(rt))
        infos.append({"path": rt.path, "rank": rt.rank, "meta": rt.meta, "events": rt.events_total,
                      "unit": rt.time_unit, "categories": rt.categories})
        del rt
    tables: dict[str, pd.DataFrame] = {
        "trace_gpu_time": pd.DataFrame([r["gpu_row"] for r in results if "gpu_row" in r]),
        "trace_gpu_streams": _concat([r.get("streams") for r in results]),
        "trace_idle": pd.DataFrame([r["idle_row"] for r in results if "idle_row" in r]),
        "trace_idle_streams": _concat([r.get("idle_streams") for r in results]),
        "trace_kernel_classes": _concat([r.get("classes") for r in results]),
        "trace_top_kernels": _concat([r.get("top") for r in results]),
        "trace_launch": _concat([r.get("launch") for r in results]),
        "trace_launch_summary": pd.DataFrame([r["launch_row"] for r in results if "launch_row" in r]),
        "trace_sync": _concat([r.get("sync") for r in results]),
        "trace_transfers": _concat([r.get("transfers") for r in results]),
        "trace_steps": _concat([r.get("steps") for r in results]),
        "trace_cpu_ops": _concat([r.get("cpu_ops") for r in results]),
    }
    if include_python:
        tables["trace_python_functions"] = _concat([r.get("python") for r in results])
    tables["trace_step_summary"] = steps.step_summary(tables["trace_steps"])
    tables["trace_step_percentiles"] = steps.step_percentiles(tables["trace_steps"])
    tables["trace_graph_mode"] = steps.graph_mode_table(tables["trace_steps"])
    tables["trace_comm_split"] = _concat([r.get("comm") for r in results])
    tables["trace_capture"] = pd.DataFrame({"rank": [r["rank"] for r in results if r.get("capture")]}, dtype="int64")
    per_coll, per_rank, w = collective_skew({r["rank"]: r["comm_starts"] for r in results if "comm_starts" in r})
    warnings.extend(w)
    tables["trace_collectives"] = per_coll
    tables["trace_rank_skew"] = per_rank
    has_gpu = not tables["trace_gpu_time"].empty
    if not has_gpu:
        warnings.append("no GPU events in the trace (CPU-only, e.g. vLLM's CPU build): analysed CPU ops and "
                        "engine steps only")
    if not tables["trace_capture"].empty:
        warnings.append("this is a graph-capture trace, not serving (vLLM capture_<batch>_* annotations or "
                        "capture_model frames): its idle and launch figures describe the capture, not steps")
    if tables["trace_steps"].empty:
        warnings.append("no engine steps found (vLLM execute_context_* annotations or V1 execute_model frames, "
                        "SGLang step[...], or ProfilerStep#): per-step analysis skipped")
    warnings.extend(notes)
    spans = {r["rank"]: r["span_us"] for r in results if "span_us" in r}
    tables["trace_ranks"] = pd.DataFrame([
        {"rank": t["rank"], "file": str(t["path"]), "events": t["events"], "time_unit": t["unit"],
         "base_time_ns": t["meta"].get("baseTimeNanoseconds") if isinstance(t["meta"].get("baseTimeNanoseconds"), int)
         else None, "start_us": spans.get(t["rank"], (np.nan, np.nan))[0], "end_us": spans.get(t["rank"], (np.nan, np.nan))[1]}
        for t in infos], columns=RANK_COLUMNS).astype({"base_time_ns": "Int64"})
    tables["trace_devices"] = pd.DataFrame([{"rank": t["rank"], "device": str(d)} for t in infos
                                            for d in t["meta"].get("devices", []) if d], columns=["rank", "device"])
    tables["trace_warnings"] = pd.DataFrame({"message": pd.Series(warnings, dtype=object)})
    analysis_s = round(time.perf_counter() - t0, 3)
    tables["trace_summary"] = pd.DataFrame([{
        "files": len(infos), "ranks": len({t["rank"] for t in infos}), "events": sum(t["events"] for t in infos),
        "gpu": has_gpu, "steps": len(tables["trace_steps"]), "include_python": include_python,
        "analysis_s": analysis_s}], columns=SUMMARY_COLUMNS)
    summary = {
        "files": [str(t["path"]) for t in infos], "ranks": sorted(t["rank"] for t in infos),
        "events": sum(t["events"] for t in infos), "gpu": has_gpu,
        "devices": sorted({d for t in infos for d in t["meta"].get("devices", []) if d}),
        "time_unit": sorted({t["unit"] for t in infos}),
        "categories": _merge_counts([t["categories"] for t in infos]),
        "meta": {t["rank"]: t["meta"] for t in infos}, "include_python": include_python,
        "steps": len(tables["trace_steps"]), "analysis_s": analysis_s, "span_us": spans,
    }
    return TraceAnalysis(tables=tables, warnings=warnings, summary=summary)


def _merge_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
