"""Profiler traces in a bundle (artifacts of kind ``torch_trace``) -> trace tables, signals and sections.

The worker traces (one per rank; the API-server ``async_llm`` trace is left out: it holds no kernels and no
engine steps) are analysed together by :func:`diagnose.trace.analyze_files`. Tables are those of
docs/trace-analysis.md, plus ``trace_signals`` (the signals, so :func:`signals` needs only the tables),
``trace_span`` (each rank's trace start/end in t_s, seconds since the bundle's clock anchor, when the trace
records ``baseTimeNanoseconds``) and ``trace_warnings``. A trace that cannot be read becomes a warning, never
an exception: the rest of the bundle is still analysed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from diagnose.analysis import Section, Window
from diagnose.bundle import Bundle
from diagnose.errors import DiagnoseError
from diagnose.model import Signal
from diagnose.trace.analyze import TraceAnalysis, analyze_files
from diagnose.trace.report import build_sections

_SIGNAL_COLS = ["name", "value", "unit", "description"]


def trace_artifacts(bundle: Bundle) -> list[Path]:
    out = []
    for name, entry in sorted(bundle.artifacts().items()):
        if not isinstance(entry, dict) or entry.get("kind") != "torch_trace" or entry.get("role") == "frontend":
            continue
        p = bundle.path / str(entry.get("file") or f"artifacts/{name}")
        if p.is_file():
            out.append(p)
    return out


def tables_from_analysis(a: TraceAnalysis, anchor_unix_ns: int | None = None) -> dict[str, pd.DataFrame]:
    out = dict(a.tables)
    out["trace_signals"] = pd.DataFrame([{"name": s.name, "value": s.value, "unit": s.unit,
                                          "description": s.description} for s in a.signals], columns=_SIGNAL_COLS)
    out["trace_warnings"] = pd.DataFrame({"message": a.warnings}, dtype=object)
    rows = []
    for rank, (lo, hi) in a.summary.get("span_us", {}).items():
        base = (a.summary.get("meta", {}).get(rank) or {}).get("baseTimeNanoseconds")
        if isinstance(base, int) and anchor_unix_ns:
            rows.append({"rank": rank, "start_s": (base + lo * 1e3 - anchor_unix_ns) / 1e9,
                         "end_s": (base + hi * 1e3 - anchor_unix_ns) / 1e9})
    out["trace_span"] = pd.DataFrame(rows, columns=["rank", "start_s", "end_s"])
    summ = {k: v for k, v in a.summary.items() if isinstance(v, (int, float, str, bool))}
    summ["files_count"] = len(a.summary.get("files", []))
    summ["devices"] = ", ".join(a.summary.get("devices", []))
    summ["ranks"] = ",".join(str(r) for r in a.summary.get("ranks", []))
    out["trace_summary"] = pd.DataFrame([summ])
    return out


def tables(bundle: Bundle) -> dict[str, pd.DataFrame]:
    files = trace_artifacts(bundle)
    if not files:
        return {}
    include_python = bool((bundle.manifest.get("options") or {}).get("include_python"))
    try:
        a = analyze_files(files, include_python=include_python)
    except DiagnoseError as e:
        if bundle.kind == "trace":  # the trace is the whole input: its error is the job's error
            raise
        return {"trace_warnings": pd.DataFrame({"message": [f"trace analysis skipped: {e}"]}, dtype=object)}
    return tables_from_analysis(a, bundle.anchor_unix_ns)


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    """The trace's signals for the whole run; for a phase only when the traced span lies inside it."""
    sig = tables.get("trace_signals")
    if sig is None or sig.empty:
        return []
    if window.phase is not None:
        span = tables.get("trace_span")
        if span is None or span.empty:
            return []
        if not (float(span["start_s"].min()) >= window.start_s and float(span["end_s"].max()) <= window.end_s):
            return []
    return [Signal(name=str(r.name), value=float(r.value), unit=str(r.unit), source="trace",
                   description=str(r.description)) for r in sig.itertuples(index=False)]


def sections(tables: dict[str, pd.DataFrame]) -> list[Section]:
    if "trace_summary" not in tables:
        warn = tables.get("trace_warnings")
        if warn is None or warn.empty:
            return []
        return [Section("trace_overview", "Trace overview", "text",
                        {"text": "\n".join(str(m) for m in warn["message"])}, "trace", 10)]
    summ: dict[str, Any] = tables["trace_summary"].iloc[0].to_dict()
    ranks = [int(r) for r in str(summ.get("ranks", "")).split(",") if r.strip()]
    devices = [d for d in str(summ.get("devices", "")).split(", ") if d]
    summary = {"files": [""] * int(summ.get("files_count", 0)), "ranks": ranks, "events": int(summ.get("events", 0)),
               "devices": devices, "gpu": bool(summ.get("gpu", False))}
    warn = tables.get("trace_warnings", pd.DataFrame({"message": []}))
    return build_sections(tables, summary, [str(m) for m in warn["message"]])
