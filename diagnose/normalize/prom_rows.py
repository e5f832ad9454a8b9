"""The records normalize/prometheus.py builds from the scrapes: one histogram series of a scrape, the running
sum of a histogram's increases, and the rows of its tables (``metrics``, ``metrics_hist``,
``metrics_hist_sum``, ``metrics_scrapes``; their columns in normalize/prometheus.py). TypedDicts: plain dicts
at run time, checked by mypy."""

from __future__ import annotations

from collections import defaultdict
from typing import TypedDict


class HistSeries(TypedDict):
    """One histogram series of one scrape (or its increase since the previous scrape)."""

    b: dict[float, float]  # bucket upper bound -> count (cumulative, as the exposition has it)
    sum: float
    count: float


class HistAgg(TypedDict):
    """A histogram's increases over its series in one scrape, summed."""

    b: defaultdict[float, float]
    sum: float
    count: float
    t0: float  # the earliest previous scrape an increase is counted from
    n: int  # series with an increase


class MetricRow(TypedDict):
    """A row of the ``metrics`` table (before its deltas): one signal of one scrape, one data-parallel rank."""

    t_s: float
    signal: str
    value: float
    dp: str
    engine: str
    kind: str
    unit: str
    agg: str
    metric: str  # the metric names summed, joined with "+"


class HistRow(TypedDict):
    t0_s: float
    t_s: float
    signal: str
    le: float
    count: float


class HistSumRow(TypedDict):
    t0_s: float
    t_s: float
    signal: str
    count: float
    sum: float


class ScrapeRow(TypedDict):
    t_s: float
    scrape_ms: float | None
    parse_ms: float | None
    samples: int
    restarted: bool
