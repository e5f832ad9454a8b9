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


def monotone(cum: Sequence[float]) -> list[float]:
    """Cumulative bucket counts made non-decreasing: scrapes can tear between buckets."""
    counts = list(cum)
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    return counts


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
    counts = monotone(cum)
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


@dataclass(frozen=True)
class TailMean:
    """The mean of a histogram's observations above its ``q`` quantile (the slowest ``1 - q`` of them).

    ``lo``/``hi`` are proven bounds: every observation lies in its bucket, and the histogram's ``_sum`` caps
    the tail (the other observations are at least their buckets' lower bounds) and floors it (they are at
    most their upper bounds). ``value`` takes each finite bucket's observations as spread evenly over its lower
    part, as much of it as the ``_sum`` allows (all of it without one); the +Inf bucket's observations are
    given what the ``_sum`` leaves them."""

    q: float
    value: float
    lo: float
    hi: float
    n: float  # observations in the tail


def histogram_tail_mean(q: float, les: Sequence[float], cum: Sequence[float],
                        total_sum: float | None = None) -> TailMean | None:
    """The mean of the observations above quantile ``q`` (0..1) of a cumulative histogram; None when it holds
    none (or its bounds do not end at +Inf). Bounds as in :class:`TailMean`."""
    if not les or len(les) != len(cum) or not (0.0 <= q < 1.0) or not math.isinf(les[-1]):
        return None
    counts = monotone(cum)
    total = counts[-1]
    if not total or total <= 0:
        return None
    per = [counts[i] - (counts[i - 1] if i else 0.0) for i in range(len(counts))]
    lows = [les[i - 1] if i else min(0.0, les[0]) for i in range(len(les))]
    # the estimate's spread: a finite bucket's observations evenly over its lower part (lo, lo + f * width],
    # f in (0, 1] chosen so that they sum to what the _sum leaves them (vLLM's (0, 300 ms] first bucket holds
    # 5 ms queue times: spread over all of it, the tail would read 150 ms)
    fin = [i for i in range(len(per)) if math.isfinite(les[i])]
    f = 1.0
    if total_sum is not None and math.isfinite(total_sum) and total_sum >= 0:
        floor = sum(per[i] * lows[i] for i in range(len(per)))
        half = sum(per[i] * (les[i] - lows[i]) / 2.0 for i in fin)
        if half > 0:
            f = min(1.0, max(1e-6, (total_sum - floor) / half))
    want = (1.0 - q) * total
    left = want
    lo_sum = hi_sum = est_sum = 0.0
    rest_lo = rest_hi = rest_est = 0.0  # the observations outside the tail, at their bounds / as estimated
    inf_taken = 0.0
    for i in reversed(range(len(per))):
        n = per[i]
        take = min(n, max(left, 0.0))
        left -= take
        lo, hi = lows[i], les[i]
        lo_sum += take * lo
        hi_sum += take * hi if take else 0.0
        keep = n - take
        rest_lo += keep * lo
        rest_hi += keep * hi if keep else 0.0
        if math.isinf(hi):
            inf_taken = take
            rest_est += keep * lo
            continue
        top = lo + f * (hi - lo)
        if take:  # the top ``take`` of ``n`` spread evenly over (lo, top]
            est_sum += take * (top - take / n * (top - lo) / 2.0)
        if keep:
            rest_est += keep * (lo + keep / n * (top - lo) / 2.0)
    if total_sum is not None and math.isfinite(total_sum) and total_sum >= 0:
        hi_sum = min(hi_sum, total_sum - rest_lo)
        if math.isfinite(rest_hi):
            lo_sum = max(lo_sum, total_sum - rest_hi)
        if inf_taken:
            est_sum += max(inf_taken * lows[-1], total_sum - rest_est - est_sum)
    elif inf_taken:
        est_sum += inf_taken * lows[-1]
    est_sum = min(max(est_sum, lo_sum), hi_sum)
    return TailMean(q, est_sum / want, lo_sum / want, hi_sum / want, want)
