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

import pandas as pd

from diagnose.errors import InputError
from diagnose.model import Signal
from diagnose.trace.multirank import (  # noqa: F401  (kernel_tables, cpu_op_table: moved there, kept importable)
    RANK_COLUMNS,
    SUMMARY_COLUMNS,
    ScaleOutInfo,
    TraceSummary,
    cpu_op_table,
    kernel_tables,
    merge,
    reduce_file,
)
from diagnose.trace.signals import trace_signals

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class TraceAnalysis:
    """The tables of one analysis; ``summary`` describes the input (files, metadata, event categories) for
    the report's environment part."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    summary: TraceSummary = field(default_factory=lambda: TraceSummary())

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
    input from the caller, kept after the analysis's own. One process, one rank at a time, unless a scale-out
    is in effect (:func:`diagnose.trace.distributed.scale_out`): then the ranks fan out on Dask, with the
    same per-rank reduction and merge (diagnose/trace/multirank.py), so the same result."""
    from diagnose.trace import distributed

    t0 = time.perf_counter()
    cfg = distributed.current()
    if cfg is not None and distributed.fans_out(cfg, len(files)):
        results, extra = distributed.reduce_files(files, cfg, include_python=include_python)
    else:
        results = [reduce_file(f, i, include_python=include_python) for i, f in enumerate(files)]
        extra = None
    tables, warnings, summary = merge(results, n_files=len(files), include_python=include_python, notes=notes)
    analysis_s = round(time.perf_counter() - t0, 3)
    tables["trace_summary"]["analysis_s"] = analysis_s
    summary["analysis_s"] = analysis_s
    if extra is not None:
        summary["scale_out"] = extra["scale_out"]
    return TraceAnalysis(tables=tables, warnings=warnings, summary=summary)
