"""Report sections for server metrics: load over time, latency histograms, and the TTFT cross-check
(client TTFT quantiles against the server's TTFT histogram and its buckets)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from diagnose.analysis import Section, Window
from diagnose.normalize.prom_hist import cross_check
from diagnose.normalize.prometheus import (
    _HISTOGRAM_SIGNALS,
    _fmt_bound,
    client_ttft_s,
    gauge_series,
    hist_mean,
    hist_quantile,
    hist_window,
)


def sections(tables: dict[str, pd.DataFrame]) -> list[Section]:
    out: list[Section] = []
    series = []
    for sig, label, axis, scale in (("queue_depth", "waiting requests", "left", 1.0),
                                    ("running_requests", "running requests", "left", 1.0),
                                    ("kv_usage_ratio", "KV cache usage %", "right", 100.0)):
        pts = gauge_series(tables, sig)
        if pts:
            series.append({"name": label, "points": [[round(t, 3), v * scale] for t, v in pts], "axis": axis})
    if series:
        out.append(Section("server_load", "Server queue, batch and KV cache over time", "line_chart",
                           {"series": series, "x_label": "time (s)", "y_label": "requests",
                            "y2_label": "KV cache usage (%)"}, group="server", order=20))
    df = tables.get("metrics_hist_sum")
    if df is not None and not df.empty:
        whole = Window(-math.inf, math.inf)
        rows = []
        for sig, _prefix, _p, _m, what in _HISTOGRAM_SIGNALS:
            mean = hist_mean(tables, sig, whole)
            if mean is None:
                continue
            cells: list[Any] = [what, int(mean[1]), round(mean[0] * 1e3, 2)]
            for q in (0.5, 0.99):
                est = hist_quantile(tables, sig, q, whole)
                cells.append("" if est is None else
                             f"{est.value * 1e3:.1f} in ({_fmt_bound(est.lo)}, {_fmt_bound(est.hi)}]")
            rows.append(cells)
        if rows:
            out.append(Section("server_histograms", "Server-side latency histograms (whole capture)", "table",
                               {"columns": ["histogram", "observations", "mean ms", "P50 ms (bucket)",
                                            "P99 ms (bucket)"], "rows": rows,
                                "note": "Quantiles are interpolated inside histogram buckets; the bucket is the "
                                        "true resolution (docs/engine-signals.md)."}, group="server", order=21))
    xc = crosscheck_section(tables)
    if xc is not None:
        out.append(xc)
    return out


def crosscheck_section(tables: dict[str, pd.DataFrame]) -> Section | None:
    """Client TTFT P50/P90/P99 and mean against the server TTFT histogram over the measured requests."""
    req = tables.get("requests")
    if req is None or req.empty or "end_s" not in req.columns:
        return None
    measured = req[req["ok"].astype(bool)] if "ok" in req.columns else req
    if "warmup" in measured.columns:
        measured = measured[~measured["warmup"].astype(bool)]
    if measured.empty:
        return None
    window = Window(float(measured["sent_s"].min()), float(measured["end_s"].max()), None, "measured")
    client = client_ttft_s(tables, window)
    les, cum = hist_window(tables, "ttft_seconds", window)
    mean = hist_mean(tables, "ttft_seconds", window)
    rows_in = cross_check(client, les, cum, total_sum=mean[0] * mean[1] if mean else None)
    if not rows_in:
        return None
    rows: list[list[Any]] = []
    for r in rows_in:
        rows.append([f"P{r.q * 100:g}", round(r.client * 1e3, 1), round(r.server.value * 1e3, 1),
                     f"({_fmt_bound(r.server.lo)}, {_fmt_bound(r.server.hi)}]", "yes" if r.agrees else "no",
                     f"({_fmt_bound(r.client_bucket[0])}, {_fmt_bound(r.client_bucket[1])}]"])
    client_mean = sum(client) / len(client)
    if mean is not None:
        rows.append(["mean", round(client_mean * 1e3, 1), round(mean[0] * 1e3, 1), "exact (_sum / _count)",
                     f"client - server = {(client_mean - mean[0]) * 1e3:+.1f} ms", ""])
    agree = sum(r.agrees for r in rows_in)
    note = (f"{len(client)} client requests, {cum[-1]:.0f} server TTFT observations in the same window. "
            f"{agree} of {len(rows_in)} client quantiles lie in the server quantile's bucket (the histogram's "
            "resolution). The server's TTFT starts at frontend arrival and ends when the engine emits the first "
            "token, so the client's is longer by HTTP, frontend, SSE and network time; near a bucket bound that "
            "can put the client quantile one bucket up.")
    return Section("ttft_crosscheck", "TTFT: client vs the server's own histogram", "table",
                   {"columns": ["quantile", "client ms", "server ms (interpolated)", "server bucket",
                                "client in server bucket", "client's bucket"], "rows": rows, "note": note},
                   group="latency", order=90)

