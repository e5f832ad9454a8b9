"""Normalise report data into bounded, plain chart specs: report ``Section`` records (reports/sections/),
histogram binning, flame-graph pruning, table cells, environment flattening with secret redaction.

Everything returned is plain JSON data (dict/list/str/float/int/bool/None); typed values stay typed as
reports/formatting.py view data and become text only in the template. A section that cannot be shown
becomes an ``unavailable`` spec with the reason, never an exception.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .charts import downsample
from .formatting import fmt_text, fmt_value, plain, view_value
from .sections.model import (
    FlameGraph,
    Histogram,
    LineChart,
    Section,
    StackedBars,
    Table,
    TextBlock,
    Waterfall,
)
from .view_types import (
    BarSeries,
    Binned,
    ChartSpec,
    FlameNode,
    FlameSpec,
    HistogramSpec,
    LineChartSpec,
    Series,
    StackedBarsSpec,
    TableSpec,
    TextSpec,
    UnavailableSpec,
    WaterfallRow,
    WaterfallSpec,
)

MAX_TABLE_ROWS = 200
MAX_LINE_POINTS = 400
MAX_WATERFALL_ROWS = 60
MAX_FLAME_NODES = 1200
MAX_TEXT_CHARS = 20_000
HIST_BINS = 40

_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|passw|authori[sz]ation|^auth$|cookie|header|bearer|credential|(^|[_-])token$|"
    r"private[_-]?key|signature)", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"(bearer\s+\S+|\bsk-[A-Za-z0-9_-]{8,}|\bhf_[A-Za-z0-9]{8,}|\bxox[abp]-\S+|\bgh[pousr]_[A-Za-z0-9]{8,}|"
    r"(api[_-]?key|token|secret|password)\s*[=:]\s*\S+)", re.IGNORECASE)
REDACTED = "[redacted]"


def unavailable(title: str, reason: str) -> UnavailableSpec:
    return {"kind": "unavailable", "title": title, "reason": reason}


def finite(v: Any) -> float | None:
    """A finite float or None (NaN, inf, None, non-numbers)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def num(col: Any) -> np.ndarray:
    """A table column as floats; unreadable entries become NaN (and are then left out), never an error."""
    return np.asarray(pd.to_numeric(col, errors="coerce"), dtype=float)


# -- histogram --------------------------------------------------------------------------------------
def bin_values(values: Sequence[float] | np.ndarray, bins: int = HIST_BINS) -> Binned:
    """Bin values into ``bins`` bins (log-spaced when they span more than ~1.5 decades), with P50/P90/P99."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {"bins": [], "log_x": False, "markers": [], "n": 0}
    lo, hi = float(arr.min()), float(arr.max())
    p1, p99 = np.percentile(arr, [1, 99])
    log_x = bool(lo > 0 and p1 > 0 and p99 / p1 > 30)
    if hi <= lo:
        hi = lo + (abs(lo) * 0.01 or 1.0)
    edges = np.geomspace(lo, hi, bins + 1) if log_x else np.linspace(lo, hi, bins + 1)
    counts, _ = np.histogram(arr, bins=edges)
    marks = np.percentile(arr, [50, 90, 99])
    return {
        "bins": [[float(f"{edges[i]:.6g}"), float(f"{edges[i + 1]:.6g}"), int(counts[i])] for i in range(bins)],
        "log_x": log_x,
        "markers": [{"label": lab, "x": float(f"{m:.4g}")} for lab, m in zip(("P50", "P90", "P99"), marks, strict=True)],
        "n": int(arr.size),
    }


# -- flame graph -------------------------------------------------------------------------------------
def prune_tree(root: Mapping[str, Any], *, min_frac: float = 0.002, max_nodes: int = MAX_FLAME_NODES,
               max_depth: int = 64) -> tuple[FlameNode, int]:
    """Copy of the tree without nodes under ``min_frac`` of the root (their time stays in the parent) and
    beyond ``max_depth``; raises the cut-off until at most ``max_nodes`` remain. Returns (tree, dropped)."""
    total = finite(root.get("value")) or 0.0
    frac = min_frac
    while True:
        kept, dropped = _prune(root, total * frac, max_depth, max_nodes)
        if kept[1] <= max_nodes or frac >= 0.05:
            return kept[0], dropped
        frac *= 2


def _prune(root: Mapping[str, Any], cutoff: float, max_depth: int, budget: int) -> tuple[tuple[FlameNode, int], int]:
    count, dropped = 0, 0

    def walk(node: Mapping[str, Any], depth: int) -> FlameNode:
        nonlocal count, dropped
        count += 1
        out: FlameNode = {"name": str(node.get("name", "?"))[:300], "value": finite(node.get("value")) or 0.0}
        kids: list[FlameNode] = []
        children = node.get("children") or []
        for c in sorted(children, key=lambda c: -(finite(c.get("value")) or 0.0)):
            if depth + 1 >= max_depth or (finite(c.get("value")) or 0.0) < cutoff or count > budget * 4:
                dropped += 1
                continue
            kids.append(walk(c, depth + 1))
        if kids:
            out["children"] = kids
        return out

    tree = walk(root, 0)
    return (tree, count), dropped


# -- sections ----------------------------------------------------------------------------------------
def section_view(s: Section) -> ChartSpec:
    """A Section as a bounded chart spec of plain data (typed values as reports/formatting.py view data), or
    ``unavailable`` with why."""
    build = _SECTION_BUILDERS.get(type(s.payload))
    spec: ChartSpec
    if build is None:
        spec = unavailable(s.title, f"unknown section kind {s.kind!r}")
    else:
        try:
            spec = build(s.payload)
        except (TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
            spec = unavailable(s.title, f"section payload is malformed ({type(e).__name__}: {e})")
    spec.setdefault("title", str(s.title))
    spec.update({"id": str(s.id), "title": str(s.title), "group": str(s.group), "order": s.order})
    return spec


def _cell_view(v: Any) -> Any:
    if isinstance(v, str):
        return v if len(v) <= 500 else v[:497] + "..."
    return view_value(v)


def _table(p: Table) -> TableSpec:
    rows = [[_cell_view(v) for v in r] for r in p.rows[:MAX_TABLE_ROWS]]
    note: Any = view_value(p.note)
    extra = len(p.rows) - len(rows)
    if extra > 0:
        more = f"({extra} more rows not shown)"
        note = {"parts": [*note["parts"], " " + more]} if isinstance(note, dict) else (
            (note + " " if note else "") + more)
    return {"kind": "table", "columns": list(p.columns), "rows": rows, "note": note}


def _stacked(p: StackedBars) -> StackedBarsSpec:
    cats = [view_value(c) for c in p.categories][:MAX_WATERFALL_ROWS]
    series: list[BarSeries] = [{"name": str(s.name), "values": [finite(v) or 0.0 for v in s.values[: len(cats)]]} for s in p.series]
    return {"kind": "stacked_bars", "categories": cats, "series": series, "unit": p.unit, "x_label": p.x_label,
            "y_label": p.y_label}


def _flame(p: FlameGraph) -> FlameSpec:
    tree, dropped = prune_tree(dict(p.root))
    note = f"{dropped} small frames (under 0.2% of the total, or too deep) folded into their callers" if dropped else ""
    return {"kind": "flamegraph", "root": tree, "unit": p.unit, "note": note}


def _waterfall(p: Waterfall) -> WaterfallSpec:
    rows: list[WaterfallRow] = [{"label": view_value(r.label),
             "segments": [{"name": str(s.name), "start": float(s.start), "end": float(s.end)}
                          for s in r.segments if finite(s.start) is not None and finite(s.end) is not None]}
            for r in p.rows[:MAX_WATERFALL_ROWS]]
    return {"kind": "waterfall", "rows": rows, "unit": p.unit, "y_label": "request"}


def _line(p: LineChart) -> LineChartSpec:
    series: list[Series] = [{"name": s.name, "axis": s.axis, "style": "line",
               "points": [[float(f"{x:.6g}"), float(f"{y:.6g}")] for x, y in downsample(list(s.points), MAX_LINE_POINTS)]}
              for s in p.series]
    return {"kind": "line_chart", "series": series, "x_label": p.x_label, "y_label": p.y_label,
            "y2_label": p.y2_label}


def _hist(p: Histogram) -> HistogramSpec:
    b = bin_values([v for v in (finite(x) for x in p.values) if v is not None], p.bins)
    x_label = p.x_label
    if p.unit and p.unit not in x_label:
        x_label = f"{x_label} ({p.unit})"
    return {"kind": "histogram", "x_label": x_label, "y_label": "count", **b}


def _text(p: TextBlock) -> TextSpec:
    text = fmt_text(p.text)
    return {"kind": "text", "text": view_value(p.text) if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + " [...]"}


_SECTION_BUILDERS: dict[type, Callable[[Any], ChartSpec]] = {
    Table: _table, StackedBars: _stacked, FlameGraph: _flame, Waterfall: _waterfall, LineChart: _line,
    Histogram: _hist, TextBlock: _text,
}


# -- environment ---------------------------------------------------------------------------------------
def redact_value(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(key):
        return REDACTED
    if isinstance(value, str) and _SECRET_VALUE.search(value):
        return _SECRET_VALUE.sub(REDACTED, value)
    return value


def flatten(d: Any, prefix: str = "", depth: int = 0) -> list[list[str]]:
    """Nested manifest data as [[dotted key, text value]] rows, secrets redacted, long values cut."""
    rows: list[list[str]] = []
    if isinstance(d, dict):
        for k in sorted(d, key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            v = d[k]
            if _SECRET_KEY.search(str(k)):
                rows.append([key, REDACTED])
            elif isinstance(v, dict) and v and depth < 4:
                rows.extend(flatten(v, key, depth + 1))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                rows.extend([f"{key}[{i}]", _text_value(x)] for i, x in enumerate(v[:20]))
            elif str(k).endswith("_bytes") and isinstance(v, int) and v >= 1024:
                rows.append([key, f"{v / 2**30:.3g} GiB" if v >= 2**30 else f"{v / 2**20:.3g} MiB"])
            else:
                rows.append([key, _text_value(redact_value(str(k), v))])
    elif d not in (None, "", {}, []):
        rows.append([prefix or "value", _text_value(d)])
    return rows


def _text_value(v: Any) -> str:
    if v is None or (isinstance(v, (dict, list, str)) and not v):
        return "—"
    if isinstance(v, list):
        s = ", ".join(_text_value(redact_value("", x)) for x in v)
    elif isinstance(v, dict):
        s = ", ".join(f"{k}={_text_value(redact_value(str(k), x))}" for k, x in v.items() if x not in (None, "", [], {}))
    elif isinstance(v, float):
        s = fmt_value(v) if abs(v) >= 1000 or not math.isfinite(v) else plain(v, 4)
    else:
        s = str(v)
    return s if len(s) <= 300 else s[:297] + "..."
