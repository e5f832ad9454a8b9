"""Numbers to text, in one place, when the report is rendered.

Report sections hold typed values (reports/sections/model.py: ``Quantity``, ``Phrase``); the view model
carries them as plain data (:func:`view_value`: ``{"value", "unit", "digits", "style"}`` and
``{"parts": [...]}``) and the template turns them into text with :func:`fmt_cell` / :func:`fmt_text`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from diagnose.numbers import DASH, SMALLEST, fmt_percent, fmt_value, plain

from .sections.model import STYLES, Phrase, Quantity
from .view_types import QuantityView

__all__ = ["DASH", "SMALLEST", "fmt_percent", "fmt_value", "plain"]



def bounded(v: float) -> float:
    """A table number kept to four significant digits (the precision a table cell holds)."""
    return float(f"{v:.4g}")


def fmt_quantity(q: Quantity) -> str:
    """A quantity as the report shows it (the styles are described in reports/sections/model.py)."""
    v = q.value
    if q.style == "bound" and v is not None and math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v is None or not math.isfinite(v):
        return DASH
    d = q.digits
    if q.style == "sig":
        if isinstance(v, int):
            return str(v)
        return fmt_value(bounded(round(v, d) if d is not None else v))
    if q.style == "fixed":
        return f"{v:.{d}f}"
    if q.style == "signed":
        return f"{v:+.{d}f}"
    if q.style == "percent":
        return f"{100 * v:.{d}f}%"
    if q.style == "grouped":
        return f"{int(v):,}"
    if q.style == "general":
        return f"{v:g}"
    return f"{v:g} {q.unit}".rstrip()  # bound


# -- typed values in the view model (plain JSON) and back ------------------------------------------------
def view_value(v: Any) -> Any:
    """A section value as plain JSON: a Quantity as {"value", "unit", "digits", "style"} (an infinite value
    as value None with "inf": +1/-1), a Phrase as {"parts": [...]}; str, int and None as they are."""
    if isinstance(v, Quantity):
        out: QuantityView = {"value": None, "unit": v.unit, "digits": v.digits, "style": v.style}
        x = v.value
        if x is not None and math.isfinite(x):
            out["value"] = x
        elif x is not None and math.isinf(x):
            out["inf"] = 1 if x > 0 else -1
        return out
    if isinstance(v, Phrase):
        return {"parts": [view_value(p) for p in v.parts]}
    return v


def _quantity_of(d: Mapping[str, Any]) -> Quantity:
    value = d.get("value")
    if value is None and d.get("inf"):
        value = math.inf if d["inf"] > 0 else -math.inf
    style = d.get("style", "sig")
    return Quantity(value, str(d.get("unit", "")), d.get("digits"), style if style in STYLES else "sig")


def fmt_cell(c: Any) -> str:
    """A view-model cell (or note, text, label) as text: None as a dash, ints as they are, other numbers
    with three significant digits, quantities and phrases by their style."""
    if c is None:
        return DASH
    if isinstance(c, Mapping):
        if "parts" in c:
            return "".join(fmt_cell(p) if isinstance(p, Mapping) else str(p) for p in c["parts"])
        return fmt_quantity(_quantity_of(c))
    if isinstance(c, bool):
        return str(c).lower()
    if isinstance(c, int):
        return str(c)
    if isinstance(c, float):
        return fmt_value(c)
    return str(c)


def is_numeric_cell(c: Any) -> bool:
    """Whether a view-model cell is a number shown right-aligned (plain numbers and "sig" quantities)."""
    if isinstance(c, Mapping):
        return "parts" not in c and c.get("style", "sig") == "sig" and c.get("value") is not None
    return isinstance(c, (int, float)) and not isinstance(c, bool)


def fmt_text(t: str | Phrase | Quantity | Mapping[str, Any]) -> str:
    """A label, note or text that may hold quantities (typed, or as view data), as plain text."""
    if isinstance(t, Quantity):
        return fmt_quantity(t)
    if isinstance(t, Phrase):
        return "".join(p if isinstance(p, str) else fmt_quantity(p) for p in t.parts)
    if isinstance(t, Mapping):
        return fmt_cell(t)
    return str(t)
