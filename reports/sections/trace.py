"""Kernel-trace sections, from the trace tables alone (diagnose/trace/analyze.py documents them): the overview,
GPU time per rank, idle attribution, kernel classes and top kernels, launches, syncs, transfers, engine steps,
ranks at collectives and CPU ops."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .model import BarSeries, Cell, Histogram, Phrase, Quantity, Section, StackedBars, Table, TextBlock

Tables = Mapping[str, pd.DataFrame]
UNIT_SUFFIXES = (("_us", "us"), ("_ms", "ms"), ("_s", "s"), ("_ratio", "ratio"), ("_bytes", "bytes"),
                 ("_mb", "MB"), ("_count", "count"))
TABLES = (("trace_kernel_classes", "Kernel classes", 30), ("trace_top_kernels", "Top kernels", 31),
          ("trace_gemm", "GEMMs by what bounds them: FLOPs per byte moved against the device's ridge point "
                         "(record_shapes)", 32),
          ("trace_launch", "Launch overhead (graph-aware)", 40),
          ("trace_sync", "Host synchronisation and synchronous copies", 41), ("trace_transfers", "Memory transfers", 42),
          ("trace_step_summary", "Engine steps by type", 50), ("trace_rank_skew", "Ranks at collectives", 60),
          ("trace_comm_split", "Communication: transfer vs waiting for peers (NCCL vs custom all-reduce)", 61),
          ("trace_cpu_ops", "Top CPU ops", 70),
          ("trace_python_functions", "Top Python functions (--include-python)", 71))
STEP_COLUMNS = ("rank", "step", "step_type", "prefill_tokens", "decode_tokens", "dur_us", "gpu_dur_us",
                "gpu_busy_ratio", "queued_before_first_us", "idle_before_first_us", "idle_between_us",
                "idle_after_last_us", "graph_replays",
                "eager_kernels", "sync_blocking_us", "gemm_us", "attention_us", "norm_elementwise_us",
                "communication_us", "memory_us", "other_us", "excluded")


def unit_of(column: str) -> str:
    """The unit a column name carries in its suffix (``dur_us`` -> us); "" when it names none."""
    return next((u for suffix, u in UNIT_SUFFIXES if column.endswith(suffix)), "")


def cell(v: Any, unit: str) -> Cell:
    """One value of a trace table: numbers as quantities in the column's unit (four decimals kept)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return Quantity(f if math.isfinite(f) else None, unit, 4)
    return str(v)


def table(df: pd.DataFrame, note: str = "", limit: int = 50) -> Table:
    df = df.head(limit)
    cols = [str(c) for c in df.columns]
    units = [unit_of(c) for c in cols]
    rows = tuple(tuple(cell(v, u) for v, u in zip(row, units, strict=True))
                 for row in df.itertuples(index=False, name=None))
    return Table(tuple(cols), rows, note)


def _overview(tables: Tables) -> TextBlock:
    summ = tables["trace_summary"].iloc[0]
    ranks = tables.get("trace_ranks", pd.DataFrame(columns=["rank"]))
    dev = tables.get("trace_devices", pd.DataFrame(columns=["device"]))
    devices = sorted({str(d) for d in dev["device"]})
    parts: list[str | Quantity] = [
        "Trace files: ", Quantity(int(summ["files"]), "files"), f"; ranks: {sorted(int(r) for r in ranks['rank'])}; "
        "events: ", Quantity(int(summ["events"]), "events", style="grouped"),
        f"; devices: {', '.join(devices) or 'not recorded'}."]
    if not bool(summ["gpu"]):
        parts.append("\nNo GPU events: this is a CPU-only trace; CPU ops and engine steps are analysed.")
    parts += [f"\nWarning: {w}" for w in _warnings(tables)]
    return TextBlock(Phrase(tuple(parts)))


def _warnings(tables: Tables) -> list[str]:
    w = tables.get("trace_warnings")
    return [] if w is None else [str(m) for m in w["message"]]


def sections(tables: Tables) -> list[Section]:
    if "trace_summary" not in tables:
        warn = _warnings(tables)
        return [Section("trace_overview", "Trace overview", TextBlock("\n".join(warn)), "trace", 10)] if warn else []
    secs = [Section("trace_overview", "Trace overview", _overview(tables), "trace", 10)]
    secs += _step_sections(tables)
    g = tables.get("trace_gpu_time", pd.DataFrame())
    if not g.empty:
        secs.append(Section("trace_gpu_time_bars", "GPU time per rank", StackedBars(
            tuple(f"rank {r}" for r in g["rank"]),
            tuple(BarSeries(n, tuple(round(float(v) / 1e3, 3) for v in g[c]))
                  for n, c in (("compute", "compute_us"), ("communication (exposed)", "comm_exposed_us"),
                               ("memory (exposed)", "memory_exposed_us"), ("idle", "idle_us"))),
            "ms", x_label="rank", y_label="ms"), "trace", 20))
        secs.append(Section("trace_gpu_time", "GPU busy, idle, compute and communication",
                            table(g, "window = first to last GPU activity of the rank"), "trace", 21))
    idle = tables.get("trace_idle", pd.DataFrame())
    if not idle.empty:
        secs.append(Section("trace_idle", "Idle attribution (all streams merged)", table(
            idle, "host_wait: launched after the GPU went idle; launch_overhead: gap < 30 µs; other: waits, syncs"),
            "trace", 22))
    for key, title, order in TABLES:
        df = tables.get(key, pd.DataFrame())
        if not df.empty:
            secs.append(Section(key, title, table(df), "trace", order))
    from diagnose.trace.steps import included

    st = included(tables.get("trace_steps", pd.DataFrame()))
    if not st.empty:
        secs.append(Section("trace_step_hist", "Engine-step duration", Histogram(
            tuple(round(float(v) / 1e3, 4) for v in st["dur_us"].to_numpy()[:20000]), "ms",
            x_label="step duration", bins=40), "trace", 51))
    return secs


def _step_sections(tables: Tables) -> list[Section]:
    """The report's lead: the per-step summary and graph-mode sentence, percentiles over steps, the steps."""
    from diagnose.trace.steps import steps_sentence

    st = tables.get("trace_steps", pd.DataFrame())
    gm = tables.get("trace_graph_mode", pd.DataFrame())
    lines = [steps_sentence(g) for _, g in st.groupby("rank", sort=True)] if not st.empty else []
    lines += [f"Graph mode{'' if len(gm) == 1 else f' (rank {int(r)})'}: {t}"
              for r, t in zip(gm["rank"], gm["sentence"], strict=True)] if not gm.empty else []
    if not lines:
        return []
    out = [Section("trace_steps_lead", "Steps and graph mode", TextBlock("\n".join(lines)), "trace", 11)]
    pct = tables.get("trace_step_percentiles", pd.DataFrame())
    if not pct.empty:
        out.append(Section("trace_step_percentiles", "Per-step figures, percentiles over steps (µs unless ratio)",
                           table(pct), "trace", 12))
    if not st.empty:
        cols = [c for c in STEP_COLUMNS if c in st]
        out.append(Section("trace_step_table", "Per-step table (first 50 steps)",
                           table(st[cols], "GPU duration and class split from the step's kernels; host gaps located "
                                           "before the first kernel, between kernels / graph replays, after the last; "
                                           "'excluded': a warm-up or profiler start/stop step, left out of the "
                                           "percentiles, graph mode and findings"),
                           "trace", 13))
    return out
