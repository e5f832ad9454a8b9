"""What the compare page draws (reports/compare.py only formats it): per matched level, A's and B's latency
distributions as CDFs (TTFT per request, ITL per token gap), and each run's throughput-latency curve, one point
per level, from the values the comparison itself reports (``MetricDiff.a`` / ``.b``), so a picture never shows
another number than its table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from diagnose.compare.records import LevelPictures, Pictures

if TYPE_CHECKING:
    from diagnose.compare.core import Comparison

CDF_POINTS = 101  # quantiles drawn per distribution (0, 1, ..., 100%)
CURVE_KEYS = ("output_tps", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")


def cdf_points(values: np.ndarray, n: int = CDF_POINTS) -> list[list[float]]:
    """[value, cumulative share] at ``n`` evenly spaced shares (the empirical quantiles); [] without values."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return []
    qs = np.linspace(0.0, 1.0, n)
    xs = np.quantile(v, qs)
    return [[float(x), float(q)] for x, q in zip(xs, qs, strict=True)]


def _num(v: float) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def curve_rows(c: Comparison, side: str) -> list[dict[str, str | float | None]]:
    """Per level (in load order), the run's output tok/s and latency percentiles, as the comparison has them."""
    rows = []
    for lv in c.levels:
        row: dict[str, str | float | None] = {"label": lv.label}
        for m in lv.metrics:
            if m.metric in CURVE_KEYS:
                row[m.metric] = _num(m.a if side == "a" else m.b)
        rows.append(row)
    return rows


def pictures(c: Comparison) -> Pictures:
    """``levels``: per level, {"level", "ttft": {"a", "b"}, "itl": {"a", "b"}} CDF points in ms; ``curves``:
    {"a": rows, "b": rows} (``curve_rows``)."""
    levels: list[LevelPictures] = []
    for lv in c.levels:
        pair = c.samples.get(lv.label)
        if pair is None:
            continue
        sa, sb = pair
        levels.append({"level": lv.label,
                       "ttft": {"a": cdf_points(sa.values["ttft"]), "b": cdf_points(sb.values["ttft"])},
                       "itl": {"a": cdf_points(sa.itl), "b": cdf_points(sb.itl)}})
    return {"levels": levels, "curves": {"a": curve_rows(c, "a"), "b": curve_rows(c, "b")}}


def valid_rows(rows: Sequence[Mapping[str, object]]) -> int:
    return sum(1 for r in rows if r.get("output_tps") is not None)
