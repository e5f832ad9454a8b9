"""Server-metric sections: load over time, the latency histograms, and the TTFT cross-check (client TTFT
quantiles against the server's TTFT histogram and its buckets)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from diagnose.analysis import Window
from diagnose.normalize.prom_hist import cross_check
from diagnose.normalize.prometheus import (
    HISTOGRAM_SIGNALS,
    client_ttft_s,
    gauge_series,
    hist_mean,
    hist_quantile,
    hist_window,
)

from .model import Cell, LineChart, LineSeries, Phrase, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]


def bucket(lo_s: float, hi_s: float) -> Phrase:
    """A histogram bucket (lo, hi] of bounds in seconds, shown in ms."""
    return Phrase(("(", Quantity(lo_s * 1e3, "ms", style="bound"), ", ",
                   Quantity(hi_s * 1e3, "ms", style="bound"), "]"))


def _ms(v_s: float, digits: int) -> Quantity:
    return Quantity(v_s * 1e3, "ms", digits)


def sections(tables: Tables, run_window: Window | None = None) -> list[Section]:
    out: list[Section] = []
    series = []
    for sig, label, axis, scale in (("queue_depth", "waiting requests", "left", 1.0),
                                    ("running_requests", "running requests", "left", 1.0),
                                    ("kv_usage_ratio", "KV cache usage %", "right", 100.0)):
        pts = gauge_series(dict(tables), sig)
        if pts:
            series.append(LineSeries(label, tuple((round(t, 3), v * scale) for t, v in pts),
                                     "right" if axis == "right" else "left"))
    if series:
        out.append(Section("server_load", "Server queue, batch and KV cache over time", LineChart(
            tuple(series), x_label="time (s)", y_label="requests", y2_label="KV cache usage (%)"),
            group="server", order=20))
    df = tables.get("metrics_hist_sum")
    if df is not None and not df.empty:
        whole = Window(-math.inf, math.inf)
        rows: list[tuple[Cell, ...]] = []
        for sig, _prefix, _p, _m, what in HISTOGRAM_SIGNALS:
            mean = hist_mean(dict(tables), sig, whole)
            if mean is None:
                continue
            cells: list[Cell] = [what, int(mean[1]), _ms(mean[0], 2)]
            for q in (0.5, 0.99):
                est = hist_quantile(dict(tables), sig, q, whole)
                cells.append("" if est is None else
                             Phrase((Quantity(est.value * 1e3, "ms", 1, "fixed"), " in ", *bucket(est.lo, est.hi).parts)))
            rows.append(tuple(cells))
        if rows:
            out.append(Section("server_histograms", "Server-side latency histograms (whole capture)", Table(
                ("histogram", "observations", "mean ms", "P50 ms (bucket)", "P99 ms (bucket)"), tuple(rows),
                "Quantiles are interpolated inside histogram buckets; the bucket is the true resolution "
                "(docs/engine-signals.md)."), group="server", order=21))
    xc = crosscheck_section(tables, run_window)
    if xc is not None:
        out.append(xc)
    return out


def crosscheck_section(tables: Tables, run_window: Window | None = None) -> Section | None:
    """Client TTFT P50/P90/P99 and mean against the server TTFT histogram over the run window (the window of
    every other figure: the baseline is not in it), client requests chosen by diagnose.requests."""
    req = tables.get("requests")
    if req is None or req.empty or "end_s" not in req.columns:
        return None
    t = dict(tables)
    window = run_window or Window(-math.inf, math.inf)
    client = client_ttft_s(t, window)
    les, cum = hist_window(t, "ttft_seconds", window)
    mean = hist_mean(t, "ttft_seconds", window)
    rows_in = cross_check(client, les, cum, total_sum=mean[0] * mean[1] if mean else None)
    if not rows_in:
        return None
    rows: list[tuple[Cell, ...]] = []
    for r in rows_in:
        rows.append((Phrase(("P", Quantity(r.q * 100, "percentile", style="general"))),
                     _ms(r.client, 1), _ms(r.server.value, 1), bucket(r.server.lo, r.server.hi),
                     "yes" if r.agrees else "no", bucket(r.client_bucket[0], r.client_bucket[1])))
    client_mean = sum(client) / len(client)
    if mean is not None:
        rows.append(("mean", _ms(client_mean, 1), _ms(mean[0], 1), "exact (_sum / _count)",
                     Phrase(("client - server = ", Quantity((client_mean - mean[0]) * 1e3, "ms", 1, "signed"),
                             " ms")), ""))
    agree = sum(r.agrees for r in rows_in)
    note = Phrase((Quantity(len(client), "requests"), " client requests, ",
                   Quantity(cum[-1], "observations", 0, "fixed"), " server TTFT observations in the same window. ",
                   Quantity(agree, "quantiles"), " of ", Quantity(len(rows_in), "quantiles"),
                   " client quantiles lie in the server quantile's bucket (the histogram's resolution). The server's "
                   "TTFT starts at frontend arrival and ends when the engine emits the first token, so the client's "
                   "is longer by HTTP, frontend, SSE and network time; near a bucket bound that can put the client "
                   "quantile one bucket up."))
    return Section("ttft_crosscheck", "TTFT: client vs the server's own histogram", Table(
        ("quantile", "client ms (rank ceil(q·n), as a histogram counts)", "server ms (interpolated)", "server bucket", "client in server bucket",
         "client's bucket"), tuple(rows), note), group="latency", order=90)
