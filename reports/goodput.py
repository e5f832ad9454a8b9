"""The SLO-edge search (``attach --find-max-goodput``; diagnose/runs/goodput.py) as one self-contained HTML file:
the max-goodput level and saturation first, then the throughput-latency curve, then one row per level with
each SLO term's interval. Autoescaped jinja2, inline CSS and SVG, no external URL."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from markupsafe import Markup

from .curve import curve_spec
from .formatting import fmt_value
from .render import _env, svg

HERE = Path(__file__).resolve().parent


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt_value(v)


def render_search(r: dict[str, Any], headline: list[str]) -> str:
    """``r``: ``SearchResult.to_json()``; ``headline``: its summary lines (the first ones lead the page)."""
    points = sorted(r["points"], key=lambda p: p["level"])
    rows = [{"label": p["label"], "output_tps": p["output_tps"], **p["curve"],
             **{n: t["value"] for n, t in p["terms"].items()}} for p in points]
    chart = curve_spec(rows, r["slo"], knee=r["saturation"], max_goodput=r["max_goodput"])
    css = Markup((HERE / "assets" / "report.css").read_text(encoding="utf-8"))
    level = "ok" if r["max_goodput"] else "error"
    return _env().get_template("goodput.html").render(
        r=r, points=points, chart=svg(chart) if chart else None, headline=headline, level=level, css=css,
        fmt=_fmt)
