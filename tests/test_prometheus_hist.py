"""Histogram arithmetic: Prometheus-style quantiles, the _sum bound, counter resets, the TTFT cross-check."""

from __future__ import annotations

import math
import random

import pytest

from diagnose.normalize.prom_hist import (
    bucket_of,
    counter_increments,
    cross_check,
    empirical_cdf_at,
    histogram_quantile,
    histogram_tail_mean,
    parse_le,
    sample_quantile,
)

VLLM_QUEUE_LES = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                  960.0, 1920.0, 7680.0, math.inf]


def _hist(values: list[float], les: list[float]) -> tuple[list[float], float]:
    return [float(sum(v <= le for v in values)) for le in les], float(sum(values))


def test_interpolation_matches_prometheus_histogram_quantile() -> None:
    les = [0.1, 0.2, 0.4, math.inf]
    cum = [10.0, 30.0, 40.0, 40.0]
    est = histogram_quantile(0.5, les, cum)
    assert est is not None
    assert (est.lo, est.hi, est.count) == (0.1, 0.2, 40)
    assert est.value == pytest.approx(0.1 + 0.1 * (20 - 10) / 20)
    assert histogram_quantile(0.1, les, cum).value == pytest.approx(0.04)  # type: ignore[union-attr]


def test_quantile_in_the_inf_bucket_reports_the_last_finite_bound() -> None:
    est = histogram_quantile(0.99, [1.0, math.inf], [5.0, 10.0])
    assert est is not None and est.value == 1.0 and est.lo == 1.0 and math.isinf(est.hi)


def test_empty_or_malformed_histograms_give_none() -> None:
    assert histogram_quantile(0.5, [1.0, math.inf], [0.0, 0.0]) is None
    assert histogram_quantile(0.5, [], []) is None
    assert histogram_quantile(0.5, [1.0, 2.0], [1.0, 2.0]) is None  # no +Inf bucket
    assert histogram_quantile(1.5, [1.0, math.inf], [1.0, 1.0]) is None


def test_torn_scrape_is_made_monotone() -> None:
    # bucket le=2 read one observation short of le=1: treated as empty, never as -1 observations
    les = [1.0, 2.0, math.inf]
    est = histogram_quantile(0.5, les, [6.0, 5.0, 10.0])
    assert est is not None and (est.lo, est.hi) == (0.0, 1.0) and 0 <= est.value <= 1
    est = histogram_quantile(0.65, les, [6.0, 5.0, 10.0])
    assert est is not None and (est.lo, est.value) == (2.0, 2.0) and math.isinf(est.hi)


def test_sum_bound_tightens_a_wide_first_bucket() -> None:
    # 100 queue times of 5 ms in vLLM's (0, 300 ms] first bucket
    cum, total = _hist([0.005] * 100, VLLM_QUEUE_LES)
    plain = histogram_quantile(0.5, VLLM_QUEUE_LES, cum)
    bounded = histogram_quantile(0.5, VLLM_QUEUE_LES, cum, total)
    assert plain is not None and bounded is not None
    assert plain.value == pytest.approx(0.15)
    assert bounded.bound == pytest.approx(0.5 / 51, rel=1e-6)  # 0.5 s / (100 - 50 + 1)
    assert bounded.value < 0.01 and (bounded.lo, bounded.hi) == (0.0, 0.3)


@pytest.mark.parametrize("seed", range(25))
def test_sum_bound_never_excludes_the_true_quantile(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 400)
    shape = rng.choice(["exp", "uniform", "bimodal"])
    vals = []
    for _ in range(n):
        if shape == "exp":
            vals.append(rng.expovariate(1 / rng.choice([0.01, 0.2, 2.0])))
        elif shape == "uniform":
            vals.append(rng.uniform(0, 3))
        else:
            vals.append(rng.choice([0.002, 0.004]) if rng.random() < 0.8 else rng.uniform(0.5, 40))
    cum, total = _hist(vals, VLLM_QUEUE_LES)
    ys = sorted(vals)
    for q in (0.5, 0.9, 0.99):
        est = histogram_quantile(q, VLLM_QUEUE_LES, cum, total)
        assert est is not None
        true = ys[max(0, math.ceil(q * n) - 1)]  # the rank-ceil(q n) observation: the one the bucket holds
        assert est.lo <= true <= est.hi
        assert true <= est.bound * (1 + 1e-9) and est.bound <= est.hi
        assert est.lo <= est.value <= est.bound


def test_counter_increments_detect_resets_and_skip_gaps() -> None:
    assert counter_increments([5, 7, 7, 2, 4]) == [pytest.approx(math.nan, nan_ok=True), 2, 0, 2, 2]
    assert counter_increments([5, 7, 9], [False, False, True])[1:] == [2, 9]  # restart flagged
    out = counter_increments([1.0, math.nan, 4.0])
    assert math.isnan(out[0]) and math.isnan(out[1]) and out[2] == 3


def test_parse_le_and_bucket_of() -> None:
    assert parse_le("+Inf") == math.inf and parse_le("0.25") == 0.25
    with pytest.raises(ValueError):
        parse_le("fast")
    assert bucket_of(0.3, [0.1, 0.3, math.inf]) == (0.1, 0.3)
    assert bucket_of(0.05, [0.1, math.inf]) == (0.0, 0.1)
    assert bucket_of(9.0, [0.1, 1.0]) == (1.0, math.inf)


def test_sample_quantile_and_cdf() -> None:
    assert sample_quantile([4, 1, 3, 2], 0.5) == 2  # the 2nd of 4: inverted CDF
    assert sample_quantile([1, 2, 3, 4], 0.51) == 3 and sample_quantile([1, 2, 3, 4], 0.0) == 1
    assert sample_quantile([7], 0.99) == 7
    assert empirical_cdf_at([0.1, 0.2, 0.3, 0.4], [0.15, 0.3, 1.0]) == [0.25, 0.75, 1.0]
    assert all(math.isnan(x) for x in empirical_cdf_at([], [1.0]))


def test_cross_check_agrees_when_client_is_in_the_server_bucket() -> None:
    les = [0.04, 0.06, 0.08, 0.1, 0.25, math.inf]
    server = [0.05] * 50 + [0.09] * 40 + [0.2] * 10
    client = [v + 0.003 for v in server]  # a few ms of HTTP + SSE on top
    cum, total = _hist(server, les)
    rows = cross_check(client, les, cum, total_sum=total)
    assert [r.q for r in rows] == [0.5, 0.9, 0.99]
    assert [r.agrees for r in rows] == [True, True, True]
    assert rows[0].client_bucket == (0.04, 0.06)
    # a client 100 ms slower than the engine lands in other buckets
    late = cross_check([v + 0.1 for v in server], les, cum)
    assert not late[0].agrees and late[0].client_bucket == (0.1, 0.25)
    assert cross_check([], les, cum) == [] and cross_check([0.1], les, [0.0] * len(les)) == []


# -- the mean of the slowest observations (the slow requests' TTFT split from histograms) ---------------------
@pytest.mark.parametrize("seed", range(40))
def test_tail_mean_bounds_hold_the_true_tail_mean(seed: int) -> None:
    """Whatever the observations, the tail mean's bounds hold the true mean of the slowest 10% (exact when the
    tail is a whole number of observations), and the estimate lies within them."""
    rng = random.Random(seed)
    scale = rng.choice([0.005, 0.05, 0.4, 3.0, 30.0])
    values = [rng.expovariate(1.0 / scale) for _ in range(rng.choice([10, 50, 200]))]
    cum, total = _hist(values, VLLM_QUEUE_LES)
    t = histogram_tail_mean(0.9, VLLM_QUEUE_LES, cum, total)
    assert t is not None
    slowest = sorted(values)[-round(0.1 * len(values)):]
    true = sum(slowest) / len(slowest)
    assert t.lo - 1e-9 <= true <= t.hi + 1e-9
    assert t.lo - 1e-9 <= t.value <= t.hi + 1e-9


def test_tail_mean_in_a_wide_low_bucket_follows_the_sum() -> None:
    """vLLM's first queue bucket is (0, 300 ms]: 5-15 ms queue times spread over all of it would give a tail of
    ~285 ms; spread as the _sum allows, the estimate is within a few ms of the truth."""
    values = [0.005 + 0.01 * i / 99 for i in range(100)]
    cum, total = _hist(values, VLLM_QUEUE_LES)
    t = histogram_tail_mean(0.9, VLLM_QUEUE_LES, cum, total)
    plain = histogram_tail_mean(0.9, VLLM_QUEUE_LES, cum, None)
    assert t is not None and plain is not None
    true = sum(sorted(values)[-10:]) / 10
    assert abs(t.value - true) < 0.006
    assert plain.value > 0.25  # without the sum, nothing narrows the bucket
    assert t.hi <= 0.3


def test_tail_mean_takes_the_inf_buckets_share_of_the_sum() -> None:
    """Two observations past the last finite bound: the tail (the top 20%) is them, and the _sum says how big."""
    cum = [8.0, 8.0, 10.0]
    t = histogram_tail_mean(0.8, [0.3, 0.5, math.inf], cum, 8 * 0.1 + 2 * 4.0)
    assert t is not None
    assert t.value == pytest.approx(4.0, rel=0.05)
    assert t.lo >= 0.5 and t.lo <= 4.0 <= t.hi


def test_tail_mean_of_nothing_is_none() -> None:
    assert histogram_tail_mean(0.9, [0.3, math.inf], [0.0, 0.0]) is None
    assert histogram_tail_mean(0.9, [0.3, 0.5], [1.0, 2.0]) is None  # no +Inf bucket
    assert histogram_tail_mean(1.0, [0.3, math.inf], [1.0, 2.0]) is None
