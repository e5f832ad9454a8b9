"""Stage-2 tables of the server's own metrics, computed once by the pipeline before the view (issue 32: the
report computed whole-capture histogram quantiles and the client-vs-server TTFT cross-check itself):

- ``server_load_series``: the queue, batch and KV-cache gauges over time (data-parallel engines combined);
- ``server_histograms``: each latency histogram over the whole capture: observations, the exact mean
  (_sum / _count) and P50/P99 interpolated in their buckets;
- ``ttft_crosscheck`` and ``ttft_crosscheck_summary``: client TTFT quantiles (rank ceil(q n), as a histogram
  counts) against the server's TTFT histogram over the run window, and the two means.

reports/sections/prometheus.py only formats these tables."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from diagnose.model import Window
from diagnose.normalize.prom_hist import cross_check
from diagnose.normalize.prometheus import (
    HISTOGRAM_SIGNALS,
    client_ttft_s,
    gauge_series,
    hist_mean,
    hist_quantile,
    hist_window,
)

LOAD_GAUGES = ("queue_depth", "running_requests", "kv_usage_ratio")
LOAD_COLUMNS = ["signal", "t_s", "value"]
HIST_COLUMNS = ["signal", "what", "observations", "mean_s", "p50_s", "p50_lo_s", "p50_hi_s", "p99_s", "p99_lo_s",
                "p99_hi_s"]
XC_COLUMNS = ["q", "client_s", "server_s", "server_lo_s", "server_hi_s", "agrees", "client_lo_s", "client_hi_s"]
XC_SUMMARY_COLUMNS = ["client_requests", "server_observations", "client_mean_s", "server_mean_s"]


def server_tables(tables: Mapping[str, pd.DataFrame], run_window: Window) -> dict[str, pd.DataFrame]:
    """The three tables (and the cross-check's summary) for ``tables``; {} without server metrics."""
    t = dict(tables)
    if "metrics" not in t:
        return {}
    out = {"server_load_series": _load(t), "server_histograms": _histograms(t)}
    out.update(_crosscheck(t, run_window))
    return out


def _load(t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = [(sig, ts, v) for sig in LOAD_GAUGES for ts, v in gauge_series(t, sig)]
    return pd.DataFrame(rows, columns=LOAD_COLUMNS)


def _histograms(t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    whole = Window(-math.inf, math.inf)
    rows = []
    for sig, _prefix, _p, _m, what in HISTOGRAM_SIGNALS:
        mean = hist_mean(t, sig, whole)
        if mean is None:
            continue
        row: dict[str, object] = {"signal": sig, "what": what, "observations": int(mean[1]), "mean_s": mean[0]}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            est = hist_quantile(t, sig, q, whole)
            row.update({f"{name}_s": math.nan if est is None else est.value,
                        f"{name}_lo_s": math.nan if est is None else est.lo,
                        f"{name}_hi_s": math.nan if est is None else est.hi})
        rows.append(row)
    return pd.DataFrame(rows, columns=HIST_COLUMNS)


def _crosscheck(t: dict[str, pd.DataFrame], window: Window) -> dict[str, pd.DataFrame]:
    req = t.get("requests")
    if req is None or req.empty or "end_s" not in req.columns:
        return {}
    client = client_ttft_s(t, window)
    les, cum = hist_window(t, "ttft_seconds", window)
    mean = hist_mean(t, "ttft_seconds", window)
    rows = cross_check(client, les, cum, total_sum=mean[0] * mean[1] if mean else None)
    if not rows:
        return {}
    table = pd.DataFrame([(r.q, r.client, r.server.value, r.server.lo, r.server.hi, r.agrees, r.client_bucket[0],
                           r.client_bucket[1]) for r in rows], columns=XC_COLUMNS)
    summary = pd.DataFrame([(len(client), float(cum[-1]), sum(client) / len(client),
                             math.nan if mean is None else mean[0])], columns=XC_SUMMARY_COLUMNS)
    return {"ttft_crosscheck": table, "ttft_crosscheck_summary": summary}
