"""The comparison of two runs (diagnose/compare/core.py) as one self-contained HTML file: the verdict of the
comparison first (what got worse, what got better, whether the runs are comparable), then per load level
every metric with its interval, differences first; the findings diff; the CI gate. Autoescaped jinja2,
inline CSS, no external URL."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from markupsafe import Markup

from .formatting import fmt_value
from .render import _env

HERE = Path(__file__).resolve().parent
_ORDER = {"worse": 0, "better": 1, "within noise": 2, "no significant change": 3, "too few requests": 4,
                 "not comparable": 5}


def _fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return fmt_value(v, unit)


def _rel(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:+.1%}"


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
    css = Markup((HERE / "assets" / "report.css").read_text(encoding="utf-8"))
    return _env().get_template("compare.html").render(c=c, levels=levels, headline=headline, level=level,
                                                       verification=verification, css=css, fmt=_fmt, rel=_rel)
