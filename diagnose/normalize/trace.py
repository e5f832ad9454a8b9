"""Profiler traces in a bundle (artifacts of kind ``torch_trace``) -> trace tables and signals.

The worker traces (one per rank; the API-server ``async_llm`` trace is left out: it holds no kernels and no
engine steps) are analysed together by :func:`diagnose.trace.analyze_files`. Tables are those of
docs/trace-analysis.md (``trace_summary``, ``trace_ranks``, ``trace_devices`` and ``trace_warnings``
included), plus ``trace_span``: each rank's trace start/end in t_s (seconds since the bundle's clock anchor),
when the trace records ``baseTimeNanoseconds``. Signals are computed from the tables
(:func:`diagnose.trace.signals.trace_signals`). A trace that cannot be read becomes a warning, never an
exception: the rest of the bundle is still analysed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from diagnose.analysis import Window
from diagnose.errors import DiagnoseError
from diagnose.io.bundle import Bundle
from diagnose.model import Signal
from diagnose.normalize import TableContext
from diagnose.trace.analyze import analyze_files
from diagnose.trace.signals import trace_signals

SPAN_COLUMNS = ["rank", "start_s", "end_s"]


def trace_artifacts(bundle: Bundle) -> list[Path]:
    """The worker traces among the bundle's artifacts, each confined to the bundle directory (a path that
    leads outside it, or is missing, is a warning and marks the profiler probe failed; never opened)."""
    out = []
    for name, entry in sorted(bundle.meta.artifacts.items()):
        if entry.kind != "torch_trace" or entry.role == "frontend":
            continue
        p = bundle.artifact_file(name, entry) if bundle.kind == "bundle" else bundle.path / str(entry.file)
        if p is None:
            bundle.degrade_probe("profiler", f"trace artifact {name} unusable")
            continue
        out.append(p)
    return out


def span_table(ranks: pd.DataFrame, anchor_unix_ns: int | None) -> pd.DataFrame:
    """Each rank's traced span in t_s, from its ``base_time_ns`` and first / last event (``trace_ranks``)."""
    if not anchor_unix_ns or ranks.empty:
        return pd.DataFrame(columns=SPAN_COLUMNS)
    r = ranks[ranks["base_time_ns"].notna() & ranks["start_us"].notna()]
    base = r["base_time_ns"].astype("int64")
    return pd.DataFrame({"rank": r["rank"], "start_s": (base + r["start_us"] * 1e3 - anchor_unix_ns) / 1e9,
                         "end_s": (base + r["end_us"] * 1e3 - anchor_unix_ns) / 1e9},
                        columns=SPAN_COLUMNS).reset_index(drop=True)


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    files = trace_artifacts(bundle)
    if not files:
        return {}
    ctx = ctx if ctx is not None else TableContext.defaults()
    include_python = bundle.meta.options.include_python
    try:
        a = analyze_files(files, include_python=include_python)
    except DiagnoseError as e:
        if bundle.kind == "trace":  # the trace is the whole input: its error is the job's error
            raise
        ctx.note(f"trace analysis skipped: {e}")
        bundle.degrade_probe("profiler", "its trace cannot be read")
        return {"trace_warnings": pd.DataFrame({"message": [f"trace analysis skipped: {e}"]}, dtype=object)}
    for w in a.warnings:  # damaged events the reader dropped: said on the command line and in --json too
        if "ignored" in w:
            ctx.note(f"trace: {w}")
    out = dict(a.tables)
    out["trace_span"] = span_table(out["trace_ranks"], bundle.anchor_unix_ns)
    return out


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    """The trace's signals for the whole run; for a phase only when the traced span lies inside it."""
    if "trace_summary" not in tables:
        return []
    if window.phase is not None:
        span = tables.get("trace_span")
        if span is None or span.empty:
            return []
        if not (float(span["start_s"].min()) >= window.start_s and float(span["end_s"].max()) <= window.end_s):
            return []
    return trace_signals(tables)
