"""Short load-client stalls: mark the requests one touched instead of judging the whole run invalid (issue 18).

The load client's health stream (``client_health``, one sample per 0.1 s) keeps the worst event-loop lag of
each sample; a sample whose ``loop_lag_ms`` is above the threshold ``client_loop_lag_max_ms`` is a *stall*: for that long the client
stamped no chunk and sent no request. The loop was blocked somewhere in the sample's 0.1 s plus the lag, so
the stall's span is taken as ``[t - 0.1 s - lag, t]``. A request *touched* by it was scheduled (or sent)
before the span ended and ended after it began: its send time, first-token time or chunk gaps may carry the
client's delay instead of the server's.

When the stalls are few and short (at most ``client_stall_max_count``, each at most ``client_stall_max_s``) and touched at most
``client_stall_max_touched_ratio`` of the run's requests, they are *marked*: the touched requests are left out of the
latency and send-lag statistics (column ``client_stall`` of the ``requests`` table, signal
``requests_excluded_client_stall``) and the stall samples out of the loop-lag P99, so one stall does not make
the run client-bound. Otherwise nothing is marked and the self-check judges the run as before (a client that
stalls often, or long, or across much of the run, is the bottleneck). Table ``client_stalls`` lists every
stall with its recorded cause (``stall_cause``, GC pause and generation, flush slice: docs/metrics.md) and
whether it was marked. docs/metrics.md states the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diagnose.io.bundle import Bundle

TICK_S = 0.1  # one health sample covers this much time before its stamp (the health stream's period)
# the judgement numbers live in rules/thresholds.yaml (overridable with --threshold): the pipeline passes the
# analysis's thresholds to the table stage (diagnose.normalize.TableContext), and from there to mark() and stalls()
LAG_KEY = "client_loop_lag_max_ms"  # a stall = a sample over the client-bound loop-lag bound
COUNT_KEY, SPAN_KEY, SHARE_KEY = "client_stall_max_count", "client_stall_max_s", "client_stall_max_touched_ratio"


STALL_COLUMNS = ["start_s", "end_s", "lag_ms", "cause", "gc_pause_ms", "gc_generation", "flush_records",
                 "requests", "marked"]


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def stalls(bundle: Bundle, thresholds: Mapping[str, float]) -> pd.DataFrame:
    """Every health sample over the threshold ``client_loop_lag_max_ms``, as a span with its recorded cause (``requests`` and
    ``marked`` are filled by :func:`mark`)."""
    anchor = bundle.anchor_mono_ns
    limit = float(thresholds[LAG_KEY])
    rows = []
    for h in bundle.iter_records("client_health"):
        lag = _num(h.get("loop_lag_ms"))
        t = _num(h.get("t_ns"))
        if not (math.isfinite(lag) and math.isfinite(t)) or lag <= limit:
            continue
        end = (t - anchor) / 1e9
        rows.append({"start_s": end - TICK_S - lag / 1e3, "end_s": end, "lag_ms": lag,
                     "cause": h.get("stall_cause") or "unknown", "gc_pause_ms": _num(h.get("gc_pause_ms")),
                     "gc_generation": _num(h.get("gc_generation")), "flush_records": _num(h.get("flush_records")),
                     "requests": 0, "marked": False})
    return pd.DataFrame(rows, columns=STALL_COLUMNS)


def _touched(req: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """Per request: overlaps any of ``spans`` (from the earlier of its schedule and send time to its end)."""
    out = np.zeros(len(req), dtype=bool)
    if req.empty or spans.empty:
        return out
    sent = req["sent_s"].to_numpy(dtype=float)
    intended = req["intended_s"].to_numpy(dtype=float) if "intended_s" in req.columns else sent
    start = np.where(np.isfinite(intended), np.fmin(intended, sent), sent)
    end = req["end_s"].to_numpy(dtype=float)
    end = np.where(np.isfinite(end), end, start)
    for a, b in zip(spans["start_s"].to_numpy(dtype=float), spans["end_s"].to_numpy(dtype=float), strict=True):
        out |= (start <= b) & (end >= a)
    return out


def mark(tables: dict[str, pd.DataFrame], bundle: Bundle, thresholds: Mapping[str, float]) -> None:
    """Adds table ``client_stalls`` and the boolean column ``client_stall`` to ``requests`` (touched by a
    marked stall) and to ``client_health`` (the marked stall samples), in place."""
    req = tables.get("requests")
    if req is None:
        return
    st = stalls(bundle, thresholds)
    req["client_stall"] = False
    health = tables.get("client_health")
    if health is not None:
        health["client_stall"] = False
    if st.empty:
        tables["client_stalls"] = st
        return
    st["requests"] = [int(_touched(req, st.iloc[[i]]).sum()) for i in range(len(st))]
    touched = _touched(req, st)
    measured = int((~req["warmup"].astype(bool)).sum()) if "warmup" in req.columns else len(req)
    thr = thresholds
    short = len(st) <= thr[COUNT_KEY] and float((st["end_s"] - st["start_s"]).max()) <= thr[SPAN_KEY] + TICK_S
    if short and touched.sum() <= thr[SHARE_KEY] * max(1, measured):
        st["marked"] = True
        req["client_stall"] = touched
        if health is not None:
            health["client_stall"] = health["loop_lag_ms"].to_numpy(dtype=float) > thr[LAG_KEY]
    tables["client_stalls"] = st


def touched(df: pd.DataFrame) -> pd.Series:
    """Per request row: touched by a marked stall (False when :func:`mark` has not run)."""
    if "client_stall" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["client_stall"].fillna(False).astype(bool)


# what each recorded cause (probes/load_monitor.py, docs/metrics.md) means, for the report's reader
CAUSE_TEXT = {
    "busy": "the client's thread ran through it",
    "off_cpu": "the client's thread was off its CPU: a blocking call, interrupt work, or a virtual CPU the host "
               "did not run while it was idle",
    "preempted": "another task had the client's CPU: give the client a core of its own or attach --realtime",
    "page_fault": "the client's process waited for a page read back from disk (a major page fault)",
    "steal": "the hypervisor took the client's CPU: a virtual machine's neighbours, not the client",
    "flush": "record serialisation on the client's loop",
    "phase_end": "end-of-phase bookkeeping",
}


def cause_text(cause: str) -> str:
    """``cause`` with what it means (``gc_gen<N>``: a garbage collection of that generation)."""
    if cause.startswith("gc_gen"):
        return f"{cause}: a garbage collection of generation {cause[6:]}"
    return f"{cause}: {CAUSE_TEXT[cause]}" if cause in CAUSE_TEXT else cause


def report_rows(tables: dict[str, pd.DataFrame]) -> list[list[Any]]:
    """Rows [check, value, unit] for the client self-check table: the stalls, the longest with its cause,
    and how many requests were left out for them."""
    st = tables.get("client_stalls")
    if st is None or st.empty:
        return []
    worst = st.loc[st["lag_ms"].idxmax()]
    marked = bool(st["marked"].all())
    req = tables.get("requests")
    n_touched = int(touched(req).sum()) if req is not None else 0
    rows: list[list[Any]] = [
        ["client stalls (event loop blocked > client_loop_lag_max_ms)" +
         (": short, their requests left out" if marked else ": too many or too long to leave out"), len(st), "stalls"],
        [f"longest client stall (cause {cause_text(str(worst['cause']))})", round(float(worst["lag_ms"]), 1), "ms"]]
    if marked:
        rows.append(["requests touched by a client stall, excluded from statistics", n_touched, "requests"])
    return rows
