"""Server-metric sections: load over time, the latency histograms, and the TTFT cross-check (client TTFT
quantiles against the server's TTFT histogram and its buckets). Every figure is a stage-2 table the pipeline
computed (diagnose/signals/server_tables.py); this module only formats them."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from diagnose.analysis import Window

from .model import Cell, LineChart, LineSeries, Phrase, Quantity, Section, Table

Tables = Mapping[str, pd.DataFrame]
LOAD_LINES = (("queue_depth", "waiting requests", "left", 1.0), ("running_requests", "running requests", "left", 1.0),
              ("kv_usage_ratio", "KV cache usage %", "right", 100.0))


def bucket(lo_s: float, hi_s: float) -> Phrase:
    """A histogram bucket (lo, hi] of bounds in seconds, shown in ms."""
    return Phrase(("(", Quantity(lo_s * 1e3, "ms", style="bound"), ", ",
                   Quantity(hi_s * 1e3, "ms", style="bound"), "]"))


def _ms(v_s: float, digits: int) -> Quantity:
    return Quantity(v_s * 1e3, "ms", digits)


def sections(tables: Tables, run_window: Window | None = None) -> list[Section]:
    """``run_window``: unused (the cross-check's window was applied when its table was computed); kept so every
    section builder has one signature."""
    out: list[Section] = []
    series = []
    load = tables.get("server_load_series")
    for sig, label, axis, scale in LOAD_LINES:
        pts = load[load["signal"] == sig] if load is not None and not load.empty else None
        if pts is not None and not pts.empty:
            series.append(LineSeries(label, tuple((round(float(ts), 3), float(v) * scale)
                                                  for ts, v in zip(pts["t_s"], pts["value"], strict=True)),
                                     "right" if axis == "right" else "left"))
    if series:
        out.append(Section("server_load", "Server queue, batch and KV cache over time", LineChart(
            tuple(series), x_label="time (s)", y_label="requests", y2_label="KV cache usage (%)"),
            group="server", order=20))
    hist = tables.get("server_histograms")
    if hist is not None and not hist.empty:
        rows: list[tuple[Cell, ...]] = []
        for r in hist.itertuples(index=False):
            cells: list[Cell] = [str(r.what), int(r.observations), _ms(float(r.mean_s), 2)]
            for name in ("p50", "p99"):
                v, lo, hi = (float(getattr(r, f"{name}{k}")) for k in ("_s", "_lo_s", "_hi_s"))
                cells.append("" if math.isnan(v) else
                             Phrase((Quantity(v * 1e3, "ms", 1, "fixed"), " in ", *bucket(lo, hi).parts)))
            rows.append(tuple(cells))
        out.append(Section("server_histograms", "Server-side latency histograms (whole capture)", Table(
            ("histogram", "observations", "mean ms", "P50 ms (bucket)", "P99 ms (bucket)"), tuple(rows),
            "Quantiles are interpolated inside histogram buckets; the bucket is the true resolution "
            "(docs/engine-signals.md)."), group="server", order=21))
    xc = crosscheck_section(tables)
    if xc is not None:
        out.append(xc)
    return out


def crosscheck_section(tables: Tables, run_window: Window | None = None) -> Section | None:
    """Client TTFT P50/P90/P99 and mean against the server TTFT histogram over the run window (the window of
    every other figure: the baseline is not in it), from the pipeline's ``ttft_crosscheck`` tables."""
    xc, summary = tables.get("ttft_crosscheck"), tables.get("ttft_crosscheck_summary")
    if xc is None or xc.empty or summary is None or summary.empty:
        return None
    s = summary.iloc[0]
    rows: list[tuple[Cell, ...]] = []
    for r in xc.itertuples(index=False):
        rows.append((Phrase(("P", Quantity(float(r.q) * 100, "percentile", style="general"))),
                     _ms(float(r.client_s), 1), _ms(float(r.server_s), 1),
                     bucket(float(r.server_lo_s), float(r.server_hi_s)), "yes" if r.agrees else "no",
                     bucket(float(r.client_lo_s), float(r.client_hi_s))))
    client_mean, server_mean = float(s["client_mean_s"]), float(s["server_mean_s"])
    if not math.isnan(server_mean):
        rows.append(("mean", _ms(client_mean, 1), _ms(server_mean, 1), "exact (_sum / _count)",
                     Phrase(("client - server = ", Quantity((client_mean - server_mean) * 1e3, "ms", 1, "signed"),
                             " ms")), ""))
    agree = int(xc["agrees"].astype(bool).sum())
    note = Phrase((Quantity(int(s["client_requests"]), "requests"), " client requests, ",
                   Quantity(float(s["server_observations"]), "observations", 0, "fixed"),
                   " server TTFT observations in the same window. ",
                   Quantity(agree, "quantiles"), " of ", Quantity(len(xc), "quantiles"),
                   " client quantiles lie in the server quantile's bucket (the histogram's resolution). The server's "
                   "TTFT starts at frontend arrival and ends when the engine emits the first token, so the client's "
                   "is longer by HTTP, frontend, SSE and network time; near a bucket bound that can put the client "
                   "quantile one bucket up."))
    return Section("ttft_crosscheck", "TTFT: client vs the server's own histogram", Table(
        ("quantile", "client ms (rank ceil(q·n), as a histogram counts)", "server ms (interpolated)", "server bucket", "client in server bucket",
         "client's bucket"), tuple(rows), note), group="latency", order=90)
