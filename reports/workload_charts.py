"""The workload as charts (issue 16, item 6): input and output length distributions, and arrivals over time.

From the client's requests (a run diagnose drove: the lengths served, the sends per second, and for an open
loop or a replay the sends it scheduled beside those it made: the replay's fidelity), or, for an observe-mode
bundle, from the server's length histograms (their own buckets as bars) and its finished-requests counter.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from diagnose.normalize.prom_hist import monotone
from diagnose.normalize.prometheus import counter_intervals, hist_window
from diagnose.requests import RUN_COUNTED, RUN_OK

from .sections_view import bin_values, num, unavailable
from .view_types import Binned, HistogramSpec, LineChartSpec, Series, UnavailableSpec

if TYPE_CHECKING:
    from diagnose.analysis import Analysis, Window

MAX_ARRIVAL_POINTS = 120  # the arrivals chart's bins: whole seconds, or wider over a long run


def _window(a: Analysis) -> Window:
    from diagnose.analysis import Window

    return a.run_window or Window(-math.inf, math.inf)


def _server_bins(a: Analysis, signal: str) -> list[list[float]]:
    """The server's length histogram over the run as bars [lo, hi, count]: its own buckets (the +Inf bucket
    drawn as wide as its lower bound), empty buckets at either end left out."""
    les, cum = hist_window(a.tables, signal, _window(a))
    if not les or not cum or cum[-1] <= 0:
        return []
    counts = monotone(cum)
    bins = []
    for i, hi in enumerate(les):
        lo = les[i - 1] if i else 0.0
        n = counts[i] - (counts[i - 1] if i else 0.0)
        bins.append([lo, hi if math.isfinite(hi) else max(2 * lo, lo + 1), n])
    nonzero = [i for i, b in enumerate(bins) if b[2] > 0]
    return bins[nonzero[0]: nonzero[-1] + 1]


def _binned(what: str, b: Binned, source: str) -> HistogramSpec:
    """A length histogram of binned values (sections_view.bin_values). No percentile markers: the workload
    card states the percentiles (each number once a page)."""
    return {"kind": "histogram", "title": f"{what} (n={b['n']}; {source})",
            "x_label": "tokens" + (", log scale" if b["log_x"] else ""), "y_label": "requests", **b, "markers": []}


def lengths(a: Analysis, key: str) -> HistogramSpec | UnavailableSpec:
    """The input (``key`` "input") or output length distribution of the measured requests."""
    what = {"input": "Input lengths", "output": "Output lengths"}[key]
    req = a.tables.get("requests")
    if req is not None and not req.empty:
        rows = req[req[RUN_OK]] if RUN_OK in req.columns else req.iloc[0:0]  # marked by the pipeline
        if key == "input":
            col = "prompt_tokens" if "prompt_tokens" in rows.columns else "prompt_tokens_planned"
            note = "the server's usage count where it gave one"
        else:
            col = "output_tokens"
            note = "tokens served"
        if col not in rows.columns:
            return unavailable(what, f"the requests table has no {col} column")
        b = bin_values(num(rows[col]))
        if b["n"] == 0:
            return unavailable(what, "no successful measured request to plot")
        return _binned(what, b, note)
    from diagnose.signals.observed import traffic_spans

    # the engine's request spans where the workload card takes its lengths from them (the same decision)
    spans = traffic_spans(a.tables, _window(a))
    if spans is not None:
        return _binned(what, bin_values(num(spans["prompt_tokens" if key == "input" else "completion_tokens"])),
                       "the engine's request spans")
    signal = {"input": "request_prompt_tokens", "output": "request_output_tokens"}[key]
    bins = _server_bins(a, signal)
    if not bins:
        return unavailable(what, "no request rows and no server length histogram")
    n = sum(b[2] for b in bins)
    return {"kind": "histogram", "title": f"{what} (n={n:.0f}; the server's histogram buckets)",
            "x_label": "tokens, log scale", "y_label": "requests", "bins": bins, "log_x": True,
            "markers": [], "n": int(n)}


def _per_second(times: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, float]:
    width = max(1.0, math.ceil((hi - lo) / MAX_ARRIVAL_POINTS))
    edges = np.arange(lo, hi + width, width)
    counts, _ = np.histogram(times, bins=edges)
    return np.column_stack([edges[:-1] - lo, counts / width]), width


def arrivals(a: Analysis) -> LineChartSpec | UnavailableSpec:
    """Requests per second over the run: sent (and, where the run had a schedule, scheduled); for an observe
    bundle, finished per second from the server's counter."""
    title = "Arrivals over time"
    req = a.tables.get("requests")
    if req is not None and not req.empty and "sent_s" in req.columns:
        rows = req[req[RUN_COUNTED]] if RUN_COUNTED in req.columns else req.iloc[0:0]
        sent = num(rows["sent_s"])
        sent = sent[np.isfinite(sent)]
        if sent.size < 2:
            return unavailable(title, "fewer than two measured requests")
        # an open loop or a replay has a schedule of its own (a closed loop's "intended" is when a slot freed)
        scheduled = a.meta.workload is not None and a.meta.workload.mode in ("rate", "replay")
        intended = num(rows["intended_s"]) if scheduled and "intended_s" in rows.columns else np.array([])
        intended = intended[np.isfinite(intended)]
        lo = float(min(sent.min(), intended.min() if intended.size else sent.min()))
        hi = float(max(sent.max(), intended.max() if intended.size else sent.max()))
        pts, width = _per_second(sent, lo, hi)
        series: list[Series] = [{"name": "sent", "axis": "left", "style": "line", "points": pts.tolist()}]
        if intended.size:
            sched, _ = _per_second(intended, lo, hi)
            series.insert(0, {"name": "scheduled", "axis": "left", "style": "line", "points": sched.tolist()})
        return {"kind": "line_chart", "title": f"{title} (requests sent per second, {width:g} s bins)",
                "x_label": "seconds since the run began", "y_label": "requests/s", "series": series}
    per = counter_intervals(a.tables, "finished_requests", _window(a))
    if per.empty:
        return unavailable(title, "no request rows and no finished-requests counter")
    t0 = float(per["t0_s"].min())
    rate = (per["delta"] / (per["t_s"] - per["t0_s"])).to_numpy(dtype=float)
    finished = [[float(t - t0), float(r)] for t, r in zip(per["t_s"], rate, strict=True)]
    return {"kind": "line_chart", "title": f"{title} (requests finished per second, the server's counter)",
            "x_label": "seconds since the first scrape", "y_label": "requests/s",
            "series": [{"name": "finished", "axis": "left", "style": "line", "points": finished}]}
