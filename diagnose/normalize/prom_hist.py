"""Prometheus histogram and counter arithmetic used by the server-metrics normaliser (no bundle access).

Quantiles follow Prometheus ``histogram_quantile``: find the bucket holding rank ``q * count`` and
interpolate linearly between its lower and upper bound (the lower bound of the first bucket is 0). The
bucket bounds are returned with the estimate so the resolution is explicit: a quantile that falls in the
``(0, 0.3]`` s bucket is only known to lie in that range whatever the interpolated value says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QuantileEstimate:
    """A histogram quantile: interpolated ``value`` and the bucket ``(lo, hi]`` it lies in (hi may be inf).

    ``bound`` is a proven upper bound for the quantile (<= hi), tighter than the bucket when the
    histogram's ``_sum`` shows the bucket's observations must be small (see :func:`histogram_quantile`);
    ``value`` interpolates within ``(lo, bound]``.
    """

    q: float
    value: float
    lo: float
    hi: float
    count: float  # observations in the histogram
    bound: float = math.inf

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def parse_le(le: str) -> float:
    """A bucket's ``le`` label as a float (``+Inf`` -> inf); ValueError when it is not a number."""
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def histogram_quantile(q: float, les: Sequence[float], cum: Sequence[float],
                       total_sum: float | None = None) -> QuantileEstimate | None:
    """Quantile ``q`` (0..1) of a cumulative histogram; None when it holds no observations.

    ``les`` are the upper bounds in increasing order, the last one +inf; ``cum`` the cumulative counts.
    A quantile in the +Inf bucket is reported as the highest finite bound with ``hi = inf``.

    With ``total_sum`` (the histogram's ``_sum``; all observations >= 0) the bucket's upper bound is
    tightened: the other buckets' observations are at least their lower bounds, so the ``n`` observations
    in the quantile's bucket sum to at most ``S = total_sum - sum(n_i * lo_i)``; if the quantile is the
    ``r``-th smallest of them, at least ``n - r + 1`` of them are >= it, hence
    ``quantile <= (S - (r - 1) * lo) / (n - r + 1)``. This matters for wide low buckets, e.g. vLLM's queue
    and prefill histograms whose first bucket is (0, 300 ms]: 5 ms queue times give a P50 near 5 ms
    instead of the 150 ms a plain interpolation reports.
    """
    if not les or len(les) != len(cum) or not (0.0 <= q <= 1.0):
        return None
    counts = list(cum)
    for i in range(1, len(counts)):  # scrapes can tear between buckets: keep the curve monotone
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if not total or total <= 0 or not math.isinf(les[-1]):
        return None
    rank = q * total
    i = next(j for j, c in enumerate(counts) if c >= rank)
    lo = les[i - 1] if i > 0 else min(0.0, les[0])
    hi = les[i]
    if math.isinf(hi):
        return QuantileEstimate(q, lo, lo, hi, total)
    prev = counts[i - 1] if i > 0 else 0.0
    in_bucket = counts[i] - prev
    bound = hi
    if total_sum is not None and math.isfinite(total_sum) and in_bucket > 0 and lo >= 0:
        others = sum((counts[j] - (counts[j - 1] if j else 0.0)) * (les[j - 1] if j else 0.0)
                     for j in range(len(counts)) if j != i)
        r = min(max(1.0, rank - prev), in_bucket)
        bucket_sum = max(0.0, total_sum - others)
        bound = min(hi, max(lo, (bucket_sum - (r - 1) * lo) / (in_bucket - r + 1)))
    value = bound if in_bucket <= 0 else lo + (bound - lo) * (rank - prev) / in_bucket
    return QuantileEstimate(q, value, lo, hi, total, bound)


def empirical_cdf_at(values: Sequence[float], bounds: Sequence[float]) -> list[float]:
    """Fraction of ``values`` <= each bound (to compare a sample with a histogram bucket by bucket)."""
    if not values:
        return [math.nan for _ in bounds]
    ys = sorted(values)
    out = []
    j = 0
    for b in bounds:
        while j < len(ys) and ys[j] <= b:
            j += 1
        out.append(j / len(ys))
    return out


def counter_increments(values: Sequence[float], resets: Sequence[bool] | None = None) -> list[float]:
    """Increase between consecutive samples of one counter; a decrease is a reset (the counter restarted
    from 0), so the increment is the new value; so is a sample flagged in ``resets`` (the process restarted
    even if the counter has already climbed past its old value). The first sample has no increment (nan)."""
    out: list[float] = []
    prev: float | None = None
    for i, v in enumerate(values):
        if math.isnan(v):  # a missing sample: the next increment spans the gap
            out.append(math.nan)
            continue
        reset = bool(resets[i]) if resets is not None and i < len(resets) else False
        out.append(math.nan if prev is None else (v if reset or v < prev else v - prev))
        prev = v
    return out


@dataclass(frozen=True)
class CrossCheckRow:
    """One quantile of a client-measured sample against the server's histogram of the same quantity."""

    q: float
    client: float  # the sample's empirical quantile
    server: QuantileEstimate
    client_bucket: tuple[float, float]  # the histogram bucket the client value falls in

    @property
    def agrees(self) -> bool:
        """The client quantile lies in the server quantile's bucket (the histogram's resolution)."""
        return self.server.contains(self.client)


def sample_quantile(values: Sequence[float], q: float) -> float:
    """The ``ceil(q * n)``-th smallest value (inverted CDF, numpy's ``inverted_cdf``): the same rank a
    histogram quantile locates, so a client quantile and the server bucket refer to the same request."""
    ys = sorted(values)
    return ys[min(len(ys) - 1, max(0, math.ceil(q * len(ys)) - 1))]


def bucket_of(x: float, les: Sequence[float]) -> tuple[float, float]:
    """The bucket (lo, hi] of a histogram with upper bounds ``les`` that holds ``x``."""
    lo = min(0.0, les[0]) if les else 0.0
    for hi in les:
        if x <= hi:
            return lo, hi
        lo = hi
    return lo, math.inf


def cross_check(client: Sequence[float], les: Sequence[float], cum: Sequence[float],
                qs: Sequence[float] = (0.5, 0.9, 0.99), total_sum: float | None = None) -> list[CrossCheckRow]:
    """Compare client-side values with a server histogram (same unit) quantile by quantile; empty when
    either side has no observations."""
    if not client:
        return []
    rows = []
    for q in qs:
        est = histogram_quantile(q, les, cum, total_sum)
        if est is None:
            return []
        c = sample_quantile(client, q)
        rows.append(CrossCheckRow(q, c, est, bucket_of(c, les)))
    return rows
