"""Numbers to text: the one formatter of every page, CLI line and finding text (never scientific notation).

reports/formatting.py builds the report's typed cells on it; rules/engine.py uses it for the evidence that
decided a cause; the normalizers for the bounds they state in a signal's description.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

DASH = "—"
SMALLEST = 0.001  # below this a number is shown as "<0.001" (a float's residue is no quantity)


def plain(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits in positional notation, never scientific ('1300', '0.0093')."""
    if x == 0:
        return "0"
    if abs(x) < SMALLEST:
        return f"<{SMALLEST:g}" if x > 0 else f">-{SMALLEST:g}"
    s = f"{x:.{digits}g}"
    if "e" in s:
        s = format(Decimal(s), "f")
    return s


def fmt_percent(share: float) -> str:
    """A share (0.934) as a percentage: whole percents from 10% up ('93%'), one decimal below ('2.5%')."""
    pct = share * 100
    if abs(pct) >= 10:
        return f"{pct:.0f}%"
    if abs(pct) >= 1:
        return f"{pct:.1f}%"
    return plain(pct, 2) + "%"


def fmt_value(v: Any, unit: str = "") -> str:
    """A number for display, the one formatter of every page: ratios as percentages (:func:`fmt_percent`),
    whole numbers from 1,000 up grouped, three significant digits otherwise, never scientific notation;
    None and non-finite values as a dash."""
    if v is None:
        return DASH
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(f):
        return DASH
    if unit == "ratio":
        return fmt_percent(f)
    if abs(f) >= 1000:
        return f"{f:,.0f}"
    if f == int(f):
        return f"{f:.0f}"
    return plain(f, 3 if abs(f) >= 1 else 2)
