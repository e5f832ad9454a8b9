"""The load-vs-latency-vs-queue timeline: requests in flight (from the requests table), TTFT over time
(each request at its send time, plus the per-bin median), and the server's queue depth when the metrics
table has it (long format: t_s, signal == "queue_depth", value). Plain data, bounded in size."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from diagnose.model import Phase

from .charts import downsample
from .sections_view import finite, num, unavailable
from .view_types import Band, LineChartSpec, Series, UnavailableSpec

TITLE = "Load vs latency vs queue depth over time"
GRID_POINTS = 300
MAX_DOTS = 600
LATENCY_BINS = 60


def timeline_chart(tables: dict[str, pd.DataFrame], phases: Sequence[Phase]) -> LineChartSpec | UnavailableSpec:
    req = tables.get("requests")
    if req is None or req.empty or not {"sent_s", "end_s"} <= set(req.columns):
        qd = _queue_depth(tables.get("metrics"))
        if not qd:
            return unavailable(TITLE, "no requests table (the load probe did not run) and no queue_depth samples")
        return {"kind": "line_chart", "title": "Server queue depth over time", "bands": [],
                "series": [{"name": "server queue depth", "axis": "left", "style": "line", "points": qd}],
                "x_label": "time since capture start (s)", "y_label": "requests queued", "y2_label": "",
                "note": "no client requests in this capture (observe-only?): in-flight count and TTFT not available"}
    sent = num(req["sent_s"])
    end = num(req["end_s"])
    keep = np.isfinite(sent) & np.isfinite(end)
    sent, end = np.sort(sent[keep]), np.sort(end[keep])
    if sent.size == 0:
        return unavailable(TITLE, "no request has both a send and an end time")
    t0, t1 = float(sent.min()), float(max(end.max(), sent.max()))
    grid = np.linspace(t0, t1, GRID_POINTS) if t1 > t0 else np.array([t0])
    in_flight = np.searchsorted(sent, grid, side="right") - np.searchsorted(end, grid, side="right")
    series: list[Series] = []
    notes: list[str] = []
    if "ttft_ms" in req.columns:
        ok = req.assign(sent_s=num(req["sent_s"]), ttft_ms=num(req["ttft_ms"]))
        ok = ok[np.isfinite(ok["ttft_ms"].to_numpy()) & np.isfinite(ok["sent_s"].to_numpy())]
        if "ok" in ok.columns:
            ok = ok[ok["ok"].fillna(False).astype(bool)]
        pts = list(zip(ok["sent_s"].astype(float), ok["ttft_ms"].astype(float), strict=True))
        series.append({"name": "TTFT per request", "axis": "left", "style": "dots",
                       "points": _round(downsample(pts, MAX_DOTS))})
        if len(pts) >= 20:
            series.append({"name": "TTFT median per time bin", "axis": "left", "style": "line",
                           "points": _binned_median(ok["sent_s"].to_numpy(float), ok["ttft_ms"].to_numpy(float), t0, t1)})
        if len(pts) > MAX_DOTS:
            notes.append(f"{len(pts)} requests: dots thinned to {MAX_DOTS}, keeping each slice's lowest and highest TTFT")
    else:
        notes.append("TTFT not available: the requests table has no ttft_ms column")
    series.append({"name": "requests in flight (client)", "axis": "right", "style": "step",
                   "points": _round(list(zip(grid.tolist(), in_flight.astype(float).tolist(), strict=True)))})
    qd = _queue_depth(tables.get("metrics"))
    if qd:
        series.append({"name": "server queue depth", "axis": "right", "style": "line", "points": qd})
    else:
        notes.append("server queue depth not available: no queue_depth samples in the metrics table "
                     "(Prometheus probe absent, failed, or engine without that metric)")
    excluded = _excluded_bands(tables.get("client_excluded"))
    if excluded:
        notes.append("shaded 'profiler on': requests overlapping it are left out of the statistics")
    return {"kind": "line_chart", "title": TITLE, "series": series, "bands": _bands(phases) + excluded,
            "x_label": "time since capture start (s)", "y_label": "TTFT (ms)",
            "y2_label": "requests (in flight / queued)", "note": "; ".join(notes)}


def _round(pts: list[tuple[float, float]]) -> list[list[float]]:
    return [[float(f"{x:.6g}"), float(f"{y:.5g}")] for x, y in pts]


def _binned_median(x: np.ndarray, y: np.ndarray, t0: float, t1: float) -> list[list[float]]:
    edges = np.linspace(t0, t1 if t1 > t0 else t0 + 1.0, LATENCY_BINS + 1)
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, LATENCY_BINS - 1)
    out: list[tuple[float, float]] = []
    for b in range(LATENCY_BINS):
        vals = y[idx == b]
        if vals.size:
            out.append(((edges[b] + edges[b + 1]) / 2, float(np.median(vals))))
    return _round(out)


def _queue_depth(metrics: pd.DataFrame | None) -> list[list[float]]:
    if metrics is None or metrics.empty or not {"t_s", "signal", "value"} <= set(metrics.columns):
        return []
    q = metrics[metrics["signal"] == "queue_depth"]
    if q.empty:
        return []
    q = q.assign(t_s=num(q["t_s"]), value=num(q["value"])).dropna(subset=["t_s", "value"])
    q = q.groupby("t_s", as_index=False)["value"].sum()  # several engine labels -> one depth per scrape
    return _round(downsample(list(zip(q["t_s"].astype(float), q["value"].astype(float), strict=True)), 400))


def _bands(phases: Sequence[Phase]) -> list[Band]:
    """Load phases as shaded x ranges (only when there is more than one phase)."""
    bands: list[Band] = [{"start": p.start_s, "end": p.end_s, "label": p.name}
             for p in phases if np.isfinite(p.start_s) and np.isfinite(p.end_s)]
    return bands if len(bands) > 1 else []


def _excluded_bands(excluded: pd.DataFrame | None) -> list[Band]:
    """Stretches left out of the statistics (the engine profiler's window) as shaded x ranges."""
    if excluded is None or excluded.empty or not {"start_s", "end_s"} <= set(excluded.columns):
        return []
    out: list[Band] = []
    for row in excluded.itertuples(index=False):
        start, end = finite(getattr(row, "start_s", None)), finite(getattr(row, "end_s", None))
        if start is not None and end is not None and end >= start:
            out.append({"start": start, "end": end, "label": f"{getattr(row, 'reason', 'excluded')} on (excluded)"})
    return out
