"""The throughput-latency curve of a sweep: one point per load level (output tok/s against TTFT and ITL
P50/P99), the SLO's limits as flat lines, the knee (saturation) and the max-goodput level marked. A chart
spec for ``render.svg`` (a line chart: TTFT on the left axis, ITL on the right)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .view_types import LineChartSpec, Series

LINES = (("ttft_p50", "TTFT P50", "left"), ("ttft_p99", "TTFT P99", "left"), ("itl_p50", "ITL P50", "right"),
         ("itl_p99", "ITL P99", "right"))
_AXIS = {"ttft": "left", "e2e": "left", "itl": "right", "tpot": "right"}


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def curve_spec(rows: Sequence[Mapping[str, Any]], slo: Mapping[str, float], *, knee: str | None = None,
               max_goodput: str | None = None) -> LineChartSpec | None:
    """``rows``: per level, in load order: ``label``, ``output_tps``, the LINES' values and those of the SLO's
    terms ('ttft_p90') in ms. ``slo``: 'ttft_p99_ms' -> limit. None when fewer than two levels have a
    throughput."""
    pts = [r for r in rows if _ok(r.get("output_tps"))]
    if len(pts) < 2:
        return None
    series: list[Series] = []
    for i, (key, name, axis) in enumerate(LINES):
        kept = [r for r in pts if _ok(r.get(key))]
        if kept:
            series.append({"name": name, "points": [[float(r["output_tps"]), float(r[key])] for r in kept],
                           "axis": axis, "style": "line", "ordered": True})
            if i == 0:  # the first line names its levels: throughput need not grow with load (a noisy host)
                series[-1]["labels"] = [str(r.get("label", "")) for r in kept]
    shown = {k for k, _, _ in LINES}
    for key in slo:  # an SLO term on a percentile the lines above do not show: its own line
        name = key.removesuffix("_ms")
        base, _, pct = name.partition("_")
        side = _AXIS.get(base)
        line = [[float(r["output_tps"]), float(r[name])] for r in pts if _ok(r.get(name))]
        if name not in shown and side is not None and line:
            series.append({"name": f"{base.upper()} {pct.upper()}", "points": line, "axis": side, "style": "line",
                           "ordered": True})
    xs = [float(r["output_tps"]) for r in pts]
    for key, limit in slo.items():
        side = _AXIS.get(key.split("_", 1)[0])
        if side is None or not _ok(limit):
            continue
        series.append({"name": f"SLO {key.removesuffix('_ms')} {limit:g} ms", "axis": side, "style": "line",
                       "points": [[min(xs), float(limit)], [max(xs), float(limit)]]})
    for label, what in ((knee, "knee (saturation)"), (max_goodput, "max goodput")):
        row = next((r for r in pts if r.get("label") == label), None)
        if row is None:
            continue
        y = next((float(row[k]) for k in ("ttft_p99", "ttft_p50") if _ok(row.get(k))), None)
        if y is not None:
            series.append({"name": f"{what}: {label}", "axis": "left", "style": "marker",
                           "points": [[float(row["output_tps"]), y]]})
    levels = ", ".join(str(r.get("label")) for r in pts)
    return {"kind": "line_chart", "title": f"Throughput vs latency, one point per level ({levels})",
            "x_label": "output tok/s", "y_label": "TTFT ms", "y2_label": "ITL ms", "series": series}
