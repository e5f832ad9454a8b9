"""The SLO-edge search (``attach --find-max-goodput``; diagnose/runs/goodput.py) as one self-contained HTML file:
the max-goodput level and saturation first, then the throughput-latency curve, then one row per level with
each SLO term's interval. Autoescaped jinja2, inline CSS and SVG, no external URL."""

from __future__ import annotations

import math
from typing import Any

from .curve import curve_spec
from .formatting import fmt_value
from .render import Page, render_page, svg


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt_value(v)


def render_search(r: dict[str, Any], headline: list[str]) -> str:
    """``r``: ``SearchResult.to_json()``; ``headline``: its summary lines (the first ones lead the page)."""
    points = sorted(r["points"], key=lambda p: p["level"])
    rows = [{"label": p["label"], "output_tps": p["output_tps"], **p["curve"],
             **{n: t["value"] for n, t in p["terms"].items()}} for p in points]
    chart = curve_spec(rows, r["slo"], knee=r["saturation"], max_goodput=r["max_goodput"])
    level = "ok" if r["max_goodput"] else "error"
    return render_page(Page("goodput.html", {"r": r, "points": points, "chart": svg(chart) if chart else None,
                                             "headline": headline, "level": level, "fmt": _fmt}))
