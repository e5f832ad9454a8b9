"""Which requests count, and their percentiles: the one definition every table, signal, chart and finding uses.

A request is in the statistics of a window when it is
  * not a warm-up request,
  * not overlapping the engine profiler's window (column ``profiled``: the profiler slows the engine),
  * not touched by a marked short stall of the load client (column ``client_stall``, normalize/client_stalls.py),
  * of the window: of its phase when the window is a phase, else sent inside [start_s, end_s] and not of a
    phase the window excludes (the baseline is a reference, never part of the run's figures).
Latency statistics (TTFT, ITL, TPOT, E2E, throughput) use the successful ones (``ok``); the error rate uses
the finished ones (``incomplete`` = stopped by the capture: neither ok nor failed). Percentiles are numpy's
linear interpolation. docs/metrics.md states the same in words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagnose.model import Window

PCTS: tuple[tuple[str, float], ...] = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("max", 100))


def _flag(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return np.asarray(df[col].fillna(False).astype(bool).to_numpy(), dtype=bool)


def window_mask(df: pd.DataFrame, window: Window, time_col: str = "sent_s",
                keep_unphased: bool = False) -> np.ndarray:
    """Rows of ``df`` (any per-request table with ``phase``/``warmup``/``profiled`` columns where it has them)
    that are in ``window``'s statistics. ``keep_unphased``: rows without a phase (server spans that no client
    request matched) are kept by time in a phase window."""
    keep: np.ndarray = ~_flag(df, "warmup") & ~_flag(df, "profiled") & ~_flag(df, "client_stall")
    return _and(keep, _of_window(df, window, time_col, keep_unphased))


def _of_window(df: pd.DataFrame, window: Window, time_col: str = "sent_s", keep_unphased: bool = False) -> np.ndarray:
    """Rows of ``df`` that belong to ``window`` by phase or time (the flags aside)."""
    in_time: np.ndarray = np.ones(len(df), dtype=bool)
    if time_col in df.columns:
        t = np.asarray(pd.to_numeric(df[time_col], errors="coerce"), dtype=float)
        in_time = (t >= window.start_s) & (t <= window.end_s)
    if "phase" not in df.columns:
        return in_time
    ph = np.asarray(pd.to_numeric(df["phase"], errors="coerce"), dtype=float)
    if window.phase is not None:
        of_phase: np.ndarray = ph == window.phase
        if keep_unphased:
            of_phase |= np.isnan(ph) & in_time
        return of_phase
    if window.exclude_phases:
        return _and(~np.isin(ph, np.asarray(window.exclude_phases, dtype=float)), in_time)
    return in_time


def _and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = a & b
    return out


@dataclass(frozen=True)
class Selection:
    """The requests of one window: ``counted`` (in the statistics), of which ``done`` (finished) and ``ok``."""

    counted: pd.DataFrame
    done: pd.DataFrame
    ok: pd.DataFrame
    total: int  # in the window, warm-up excluded, profiled and stalled included
    profiled: int  # left out for overlapping the profiler window
    stalled: int = 0  # left out for a short client stall (and not overlapping the profiler window)


def select(requests: pd.DataFrame, window: Window) -> Selection:
    """The one rule: which of ``requests`` (the client's requests table) count in ``window``."""
    # window_mask's three flags and the window, each computed once (was: three window_masks over two copies)
    of_window = _and(~_flag(requests, "warmup"), _of_window(requests, window))
    in_window = of_window  # warm-up, window
    not_profiled = _and(of_window, ~_flag(requests, "profiled"))
    counted = requests[_and(not_profiled, ~_flag(requests, "client_stall"))]
    done = counted[counted["error"].fillna("") != "incomplete"] if "error" in counted.columns else counted
    ok = counted[_flag(counted, "ok")] if "ok" in counted.columns else counted
    total, kept = int(in_window.sum()), int(not_profiled.sum())
    return Selection(counted=counted, done=done, ok=ok, total=total, profiled=total - kept, stalled=kept - len(counted))


RUN_COUNTED, RUN_OK = "run_counted", "run_ok"  # columns the pipeline adds: counted in the run window, and succeeded


def mark_run(tables: dict[str, pd.DataFrame], window: Window) -> None:
    """Adds to the requests table, in place, which requests count in the run window (``run_counted``) and which
    of those succeeded (``run_ok``), by :func:`select`: the view filters on these columns instead of selecting
    again."""
    req = tables.get("requests")
    if req is None or req.empty:
        return
    sel = select(req, window)
    tables["requests"] = req.assign(**{RUN_COUNTED: req.index.isin(sel.counted.index),
                                       RUN_OK: req.index.isin(sel.ok.index)})


def finite(values: object) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    out: np.ndarray = arr[np.isfinite(arr)]
    return out


def percentiles(values: object, pcts: Sequence[tuple[str, float]] = PCTS) -> dict[str, float]:
    """{name: value} for the finite values; empty when there are none."""
    arr = finite(values)
    if arr.size == 0:
        return {}
    q = np.percentile(arr, [p for _, p in pcts])
    return {name: float(v) for (name, _), v in zip(pcts, q, strict=True)}


def span_s(kept: pd.DataFrame, excluded: pd.DataFrame | None) -> float:
    """Last end - first send of the kept requests; with excluded windows (the profiler's), the sum of that
    over the stretches of kept requests between them, so the excluded time is not in the denominator."""
    if kept.empty:
        return math.nan
    if excluded is None or excluded.empty:
        return float(kept["end_s"].max() - kept["sent_s"].min())
    ends = np.sort(excluded["end_s"].to_numpy(dtype=float))
    # a kept request overlaps no window: the windows before it are those that ended before its send
    seg = np.searchsorted(ends, kept["sent_s"].to_numpy(dtype=float), side="left")
    g = kept.assign(_seg=seg).groupby("_seg")
    return float((g["end_s"].max() - g["sent_s"].min()).sum())


def in_flight_mean(kept: pd.DataFrame, excluded: pd.DataFrame | None = None) -> float | None:
    """Requests the client had in flight, time-weighted over the window (Little's law): the summed send-to-end
    time of the window's counted requests / the window's span (``span_s``). None without a finished one."""
    if kept.empty or not {"sent_s", "end_s"} <= set(kept.columns):
        return None
    dur = (kept["end_s"] - kept["sent_s"]).to_numpy(dtype=float)
    dur = dur[np.isfinite(dur)]
    span = span_s(kept[np.isfinite(kept["end_s"].to_numpy(dtype=float))], excluded)
    if not dur.size or not math.isfinite(span) or span <= 0:
        return None
    return float(dur.sum() / span)
