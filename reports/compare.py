"""The comparison of two runs (diagnose/compare/core.py) as one self-contained HTML file: the verdict of the
comparison first (what got worse, what got better, whether the runs are comparable), then per load level
every metric with its interval, differences first; the findings diff; the CI gate. Autoescaped jinja2,
inline CSS, no external URL."""

from __future__ import annotations

import math
from typing import Any, TypedDict

from .curve import curve_spec
from .formatting import fmt_value
from .render import Page, render_page, svg
from .view_types import LineChartSpec, Series


class CompareCharts(TypedDict):
    """The compare page's charts: per level its CDFs, and both runs' curves in one chart."""

    levels: dict[str, list[LineChartSpec]]
    curve: LineChartSpec | None

_ORDER = {"worse": 0, "better": 1, "within noise": 2, "no significant change": 3, "too few requests": 4,
                 "not comparable": 5}


def _fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return fmt_value(v, unit)


def _rel(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:+.1%}"


def _cdf_chart(title: str, x_label: str, y_label: str, pair: dict[str, Any]) -> LineChartSpec | None:
    series: list[Series] = [{"name": f"{side} ({'baseline' if side == 'A' else 'new'})", "points": pair.get(side.lower()) or [],
               "axis": "left", "style": "line"} for side in ("A", "B")]
    if not any(s["points"] for s in series):
        return None
    return {"kind": "line_chart", "title": title, "x_label": x_label, "y_label": y_label,
            "series": [s for s in series if s["points"]]}


def chart_specs(c: dict[str, Any]) -> CompareCharts:
    """The page's charts from ``c["pictures"]`` (diagnose/compare/pictures.py): per level the TTFT and ITL CDFs
    of A and B; both runs' throughput-latency curves in one chart (None with fewer than two levels)."""
    pics = c.get("pictures") or {}
    per_level: dict[str, list[LineChartSpec]] = {}
    for lv in pics.get("levels") or []:
        specs = [_cdf_chart(f"TTFT at {lv['level']}: share of requests at or below", "TTFT ms", "share of requests",
                            lv.get("ttft") or {}),
                 _cdf_chart(f"ITL at {lv['level']}: share of token gaps at or below", "ITL ms", "share of token gaps",
                            lv.get("itl") or {})]
        per_level[str(lv["level"])] = [x for x in specs if x is not None]
    curves = pics.get("curves") or {}
    series: list[Series] = []
    for side in ("a", "b"):
        spec = curve_spec(curves.get(side) or [], {})
        for sr in spec["series"] if spec is not None else []:
            series.append({**sr, "name": f"{side.upper()} {sr['name']}"})
    curve: LineChartSpec | None = None
    if series:
        curve = {"kind": "line_chart", "title": "Throughput vs latency, A and B, one point per level",
                 "x_label": "output tok/s", "y_label": "TTFT ms", "y2_label": "ITL ms", "series": series}
    return {"levels": per_level, "curve": curve}


def render_comparison(c: dict[str, Any], verification: dict[str, Any] | None = None) -> str:
    """``c``: ``Comparison.to_json()``; ``verification``: ``Verification.to_json()`` (shown first)."""
    levels = []
    worse = better = 0
    for lv in c["levels"]:
        rows = sorted(lv["metrics"], key=lambda m: _ORDER.get(m["verdict"], 9))
        worse += sum(m["verdict"] == "worse" for m in rows)
        better += sum(m["verdict"] == "better" for m in rows)
        levels.append({**lv, "metrics": [m for m in rows if m["a"] is not None or m["b"] is not None]})
    if not c["comparability"]["comparable"]:
        headline, level = "Not comparable: " + "; ".join(c["comparability"]["problems"]), "invalid"
    elif c.get("regression"):
        headline, level = "Regression: a metric is significantly worse than allowed", "error"
    elif worse:
        headline, level = f"{worse} metric(s) significantly worse, {better} better", "warning"
    elif better:
        headline, level = f"{better} metric(s) significantly better, none worse", "ok"
    else:
        headline, level = "No significant change", "ok"
    return render_page(Page("compare.html", {"c": c, "levels": levels, "headline": headline, "level": level,
                                             "verification": verification, "fmt": _fmt, "rel": _rel,
                                             "charts": chart_specs(c), "svg": svg}))
