"""samples: split out of diagnose.compare.core."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from diagnose.analysis import Analysis
from diagnose.compare.records import Spread
from diagnose.model import Phase, Window
from diagnose.requests import percentiles, select, span_s
from diagnose.signals.cost import COST_BASE, per_unit

Better = Literal["lower", "higher"]
Resample = Literal["requests", "time blocks"]


def _num(v: float) -> float | None:
    return v if isinstance(v, float) and math.isfinite(v) else None


@dataclass(frozen=True)
class MetricDef:
    name: str  # as in the signal catalogue, without the unit suffix: ttft_p99 <-> ttft_p99_ms
    unit: str
    better: Better
    resample: Resample
    signal: str  # the client signal with the same definition


def _latency(prefix: str, pcts: Sequence[str]) -> list[MetricDef]:
    return [MetricDef(f"{prefix}_{p}", "ms", "lower", "requests", f"{prefix}_{p}_ms") for p in pcts]


METRICS: tuple[MetricDef, ...] = (
    *_latency("ttft", ("p50", "p90", "p99")),
    *_latency("itl", ("p50", "p90", "p99")),
    *_latency("tpot", ("p50", "p90", "p99")),
    *_latency("e2e", ("p50", "p90", "p99")),
    MetricDef("output_tps", "tok/s", "higher", "time blocks", "output_tps"),
    MetricDef("request_rps", "req/s", "higher", "time blocks", "request_rps"),
    MetricDef("goodput_rps", "req/s", "higher", "time blocks", "goodput_rps"),
    MetricDef("goodput_ratio", "ratio", "higher", "requests", "goodput_ratio"),
)
# cost (with --cost-per-hour): the price of an hour of the deployment over what it served in that hour
COST_METRICS: tuple[MetricDef, ...] = (
    MetricDef("cost_per_mtok", "$/Mtok", "lower", "time blocks", ""),
    MetricDef("cost_per_request", "$/req", "lower", "time blocks", ""),
    MetricDef("cost_per_good_request", "$/req", "lower", "time blocks", ""),
)
METRIC_BY_NAME = {m.name: m for m in (*METRICS, *COST_METRICS)}
_PCT = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


# -- one level of one run, as arrays ------------------------------------------------------------------------
@dataclass
class LevelSample:
    """The counted requests of one load level, reduced to what the statistics need."""

    label: str
    kind: str  # "concurrency" | "rate" | "" (a run without load phases)
    level: float | None
    values: dict[str, np.ndarray]  # ttft/tpot/e2e per ok request (NaN kept: the stat drops them)
    itl: np.ndarray  # every token gap of the ok requests
    itl_req: np.ndarray  # index into the ok requests of each gap
    end_s: np.ndarray  # per ok request
    tokens: np.ndarray  # output tokens per ok request (NaN -> 0 in sums, as the signal's finite sum)
    good: np.ndarray | None  # per ok request: meets the SLO (None without an SLO)
    done: int  # finished requests (the goodput ratio's denominator)
    span_s: float
    start_s: float
    cost_per_hour: float | None = None  # the deployment's price per hour (--cost-per-hour)
    # a level run several times (--repeat): the runs one by one, and the ok requests and time blocks of the
    # pooled sample grouped by run (request / block index offsets, one more than the runs), each block's length
    repeats: list[LevelSample] = field(default_factory=list)
    blocks: np.ndarray | None = None
    req_off: np.ndarray | None = None
    block_off: np.ndarray | None = None
    block_dur: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.end_s)

    @property
    def runs(self) -> int:
        return max(1, len(self.repeats))


def _good(ok: pd.DataFrame, gaps: pd.DataFrame, slo: pd.DataFrame | None) -> np.ndarray | None:
    if slo is None or slo.empty:
        return None
    from diagnose.normalize.client import good_mask

    return np.asarray(good_mask(ok, gaps, slo).to_numpy(), dtype=bool)


def level_sample(tables: Mapping[str, pd.DataFrame], window: Window, label: str, kind: str,
                 level: float | None) -> LevelSample | None:
    req = tables.get("requests")
    if req is None or req.empty:
        return None
    sel = select(req, window)
    if sel.total == 0:
        return None
    ok = sel.ok.reset_index(drop=True)
    itl = tables.get("itl", pd.DataFrame(columns=["rid", "itl_ms"]))
    pos = {rid: i for i, rid in enumerate(ok["rid"])}
    gaps = itl[itl["rid"].isin(pos)] if not itl.empty else itl
    itl_req = np.asarray(gaps["rid"].map(pos).to_numpy(), dtype=np.int64) if len(gaps) else np.zeros(0, np.int64)
    return LevelSample(
        label=label, kind=kind, level=level,
        values={k: ok[f"{k}_ms"].to_numpy(dtype=float) for k in ("ttft", "tpot", "e2e")},
        itl=gaps["itl_ms"].to_numpy(dtype=float) if len(gaps) else np.zeros(0),
        itl_req=itl_req,
        end_s=ok["end_s"].to_numpy(dtype=float),
        tokens=np.nan_to_num(ok["output_tokens"].to_numpy(dtype=float), nan=0.0),
        good=_good(ok, gaps, tables.get("client_slo")),
        done=len(sel.done),
        span_s=span_s(sel.counted, tables.get("client_excluded")),
        start_s=float(sel.counted["sent_s"].min()) if len(sel.counted) else math.nan,
    )


def run_levels(a: Analysis) -> list[LevelSample]:
    """One sample per measured load level (a run without phases: one sample of its run window). A level run
    several times (``--repeat``) is one sample that pools its runs and keeps them apart for the resampling
    (``bootstrap``: runs first, then blocks within each run) and for the run-to-run spread."""
    measured = [p for p in a.phases if not p.is_baseline]
    out: list[LevelSample] = []
    if not measured:
        if a.run_window is not None:
            s = level_sample(a.tables, a.run_window, "run", "", None)
            if s is not None:
                out.append(s)
        return out
    groups: dict[tuple[str, float | None], list[LevelSample]] = {}
    for p in sorted(measured, key=lambda p: (p.repeat, p.phase)):
        s = level_sample(a.tables, p.window(), _label(p), p.level_kind, p.level)
        if s is not None:
            groups.setdefault(p.level_key, []).append(s)
    return [parts[0] if len(parts) == 1 else pooled(parts) for parts in groups.values()]


def pooled(parts: Sequence[LevelSample]) -> LevelSample:
    """Several runs of one level as one sample: their requests together, the time they measured added up,
    each run cut into its own blocks (``blocks_of``), and the runs kept for the two-stage resampling."""
    blocks, block_dur, req_off, block_off = [], [], [0], [0]
    for p in parts:
        b = blocks_of(p)
        k = int(b.max()) + 1 if b.size else 1
        blocks.append(b + block_off[-1])
        block_dur.append(np.full(k, p.span_s / k if p.span_s > 0 else 0.0))
        req_off.append(req_off[-1] + p.n)
        block_off.append(block_off[-1] + k)
    offsets = np.asarray(req_off[:-1], dtype=np.int64)
    first = parts[0]
    goods = [p.good for p in parts]
    return LevelSample(
        label=first.label, kind=first.kind, level=first.level,
        values={k: np.concatenate([p.values[k] for p in parts]) for k in first.values},
        itl=np.concatenate([p.itl for p in parts]),
        itl_req=np.concatenate([p.itl_req + o for p, o in zip(parts, offsets, strict=True)]),
        end_s=np.concatenate([p.end_s for p in parts]),
        tokens=np.concatenate([p.tokens for p in parts]),
        good=None if any(g is None for g in goods) else np.concatenate([g for g in goods if g is not None]),
        done=sum(p.done for p in parts),
        span_s=sum(p.span_s for p in parts),
        start_s=first.start_s,
        repeats=list(parts),
        blocks=np.concatenate(blocks),
        req_off=np.asarray(req_off, dtype=np.int64),
        block_off=np.asarray(block_off, dtype=np.int64),
        block_dur=np.concatenate(block_dur),
    )


SPREAD_METRICS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "output_tps")


def spread(s: LevelSample) -> dict[str, Spread]:
    """Run-to-run spread of a repeated level: each run's value of a few headline metrics and their range as a
    share of the median run, (max - min) / median. Empty for a level measured once."""
    if len(s.repeats) < 2:
        return {}
    out: dict[str, Spread] = {}
    for name in SPREAD_METRICS:
        vals = [point(r, METRIC_BY_NAME[name]) for r in s.repeats]
        fin = [v for v in vals if math.isfinite(v)]
        med = float(np.median(fin)) if fin else math.nan
        out[name] = {"values": [v if math.isfinite(v) else None for v in vals],
                     "spread": (max(fin) - min(fin)) / med if len(fin) >= 2 and med > 0 else None}
    return out


def _label(p: Phase) -> str:
    if p.level is None:
        return p.level_name
    unit = "c=" if p.level_kind == "concurrency" else "rate="
    return f"{unit}{p.level:g}"


# -- statistics ---------------------------------------------------------------------------------------------
def point(s: LevelSample, m: MetricDef) -> float:
    """The metric on the level's requests, by the signals' own definitions."""
    base, _, pct = m.name.rpartition("_")
    if base in ("ttft", "tpot", "e2e"):
        return percentiles(s.values[base], ((pct, _PCT[pct]),)).get(pct, math.nan)
    if base == "itl":
        return percentiles(s.itl, ((pct, _PCT[pct]),)).get(pct, math.nan)
    if not (s.span_s > 0) or s.n == 0:
        return math.nan
    if m.name in COST_BASE:
        base_name, scale = COST_BASE[m.name]
        rate = point(s, METRIC_BY_NAME[base_name])
        if s.cost_per_hour is None:
            return math.nan
        return per_unit(s.cost_per_hour, rate, scale)
    if m.name == "output_tps":
        return float(s.tokens.sum()) / s.span_s
    if m.name == "request_rps":
        return s.n / s.span_s
    if s.good is None:
        return math.nan
    if m.name == "goodput_rps":
        return float(s.good.sum()) / s.span_s
    if m.name == "goodput_ratio":
        return float(s.good.sum()) / s.done if s.done else math.nan
    raise KeyError(m.name)


MIN_BLOCKS, MAX_BLOCKS, MIN_BLOCK_S = 20, 60, 0.5
MIN_TAIL = 5  # a percentile gets a verdict only with at least this many values above it


def _too_few(s: LevelSample, m: MetricDef) -> bool:
    """A resampled percentile cannot leave the range of the values it resamples: P99 of 60 requests rests
    on the largest one, and its interval is too narrow to mean anything. A percentile is judged only when
    at least MIN_TAIL values lie above it (P99: 500 values; P90: 50)."""
    base, _, pct = m.name.rpartition("_")
    if pct not in _PCT:
        return False
    n = int(np.isfinite(s.itl).sum()) if base == "itl" else int(np.isfinite(s.values[base]).sum())
    return n * (1.0 - _PCT[pct] / 100.0) < MIN_TAIL


def blocks_of(s: LevelSample) -> np.ndarray:
    """Block index of each ok request, by its end time (module docstring: how the blocks are cut)."""
    if s.blocks is not None:
        return s.blocks
    if s.n == 0 or not (s.span_s > 0):
        return np.zeros(s.n, dtype=np.int64)
    e2e = s.values["e2e"]
    med = float(np.nanmedian(e2e)) / 1e3 if np.isfinite(e2e).any() else MIN_BLOCK_S
    k_long = math.floor(s.span_s / max(med, MIN_BLOCK_S))  # blocks as long as a request
    k = int(min(MAX_BLOCKS, max(MIN_BLOCKS, k_long), max(1, math.floor(s.span_s / MIN_BLOCK_S))))
    lo = s.start_s if math.isfinite(s.start_s) else float(np.nanmin(s.end_s))
    return np.asarray(np.clip(((s.end_s - lo) / (s.span_s / k)).astype(np.int64), 0, k - 1), dtype=np.int64)


def _weights(rng: np.random.Generator, unit: np.ndarray, units: int, resamples: int) -> np.ndarray:
    """Per resample, how many times each element is drawn when its ``unit`` (block or request) is drawn
    with replacement: shape (resamples, elements)."""
    draws = rng.integers(0, units, (resamples, units)) + (np.arange(resamples) * units)[:, None]
    counts = np.bincount(draws.ravel(), minlength=resamples * units).reshape(resamples, units)
    return counts[:, unit]


def _run_weights(rng: np.random.Generator, off: np.ndarray, resamples: int) -> np.ndarray:
    """Two-stage draw counts for units grouped by run (run ``r`` holds units ``off[r]..off[r+1]-1``): per
    resample, as many runs as there are drawn with replacement, then within each drawn run as many of its
    units as it has, with replacement. Shape (resamples, units). The spread between runs (a host that
    drifted from one run to the next) then widens the interval, as it would between two captures."""
    sizes = np.diff(off)
    runs, units = len(sizes), int(off[-1])
    counts = np.zeros(resamples * units, dtype=np.int64)
    if units == 0:
        return counts.reshape(resamples, 0)
    rows = (np.arange(resamples) * units)[:, None]
    kmax = int(sizes.max())
    cols = np.arange(kmax)[None, :]
    picks = rng.integers(0, runs, (resamples, runs))
    for j in range(runs):
        r = picks[:, j]
        k = sizes[r][:, None]
        idx = off[r][:, None] + np.floor(rng.random((resamples, kmax)) * k).astype(np.int64)
        counts += np.bincount((rows + idx)[cols < k], minlength=resamples * units)
    return counts.reshape(resamples, units)


def repeated_percentile(sorted_vals: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``counts``, ``np.percentile(np.repeat(sorted_vals, row), q)`` (linear interpolation)
    without building the repeated arrays: the k-th value of the repeated array is the first value whose
    cumulative count exceeds k."""
    cum = np.cumsum(counts, axis=1)
    total = cum[:, -1]
    h = (total - 1) * (q / 100.0)
    k = np.floor(h).astype(np.int64)
    frac = h - k
    i_lo = (cum <= k[:, None]).sum(axis=1)
    i_hi = (cum <= np.minimum(k + 1, total - 1)[:, None]).sum(axis=1)
    n = len(sorted_vals)
    v_lo = sorted_vals[np.minimum(i_lo, n - 1)]
    v_hi = sorted_vals[np.minimum(i_hi, n - 1)]
    out = np.asarray(v_lo + frac * (v_hi - v_lo), dtype=float)
    out[total == 0] = np.nan
    return out


def bootstrap(s: LevelSample, m: MetricDef, resamples: int, rng: np.random.Generator,
              resample: str = "blocks") -> np.ndarray:
    """``resamples`` values of the metric on resampled data (NaN where a resample has no value)."""
    est = point(s, m)
    out = np.full(resamples, np.nan)
    if not math.isfinite(est) or s.n == 0:
        return out
    blocks = blocks_of(s)
    by_request = resample == "requests" and m.resample == "requests"
    unit, units = (np.arange(s.n), s.n) if by_request else (blocks, int(blocks.max()) + 1)
    runs = s.req_off if by_request else s.block_off
    clustered = runs is not None and len(runs) > 2

    def weights(owner: np.ndarray, b: int) -> np.ndarray:  # draw counts per element, (b, elements)
        if clustered:
            assert runs is not None
            return _run_weights(rng, runs, b)[:, owner]
        return _weights(rng, owner, units, b)

    base, _, pct = m.name.rpartition("_")
    if base in ("ttft", "tpot", "e2e", "itl"):
        if base == "itl":
            fin = np.isfinite(s.itl)
            vals, owner = s.itl[fin], unit[s.itl_req[fin]]
        else:
            fin = np.isfinite(s.values[base])
            vals, owner = s.values[base][fin], unit[fin]
        if vals.size == 0:
            return out
        order = np.argsort(vals, kind="stable")
        vals, owner = vals[order], owner[order]
        step = max(1, 2_000_000 // max(vals.size, 1))  # bounded memory: at most ~2 M weights at a time
        for lo in range(0, resamples, step):
            b = min(step, resamples - lo)
            out[lo:lo + b] = repeated_percentile(vals, weights(owner, b), _PCT[pct])
        return out
    if m.name == "goodput_ratio":
        assert s.good is not None
        if by_request and not clustered:  # the done requests that were not ok count as not good
            flags = np.zeros(max(s.done, s.n), dtype=bool)
            flags[: s.n] = s.good
            idx = rng.integers(0, flags.size, (resamples, flags.size))
            return np.asarray(flags[idx].mean(axis=1), dtype=float)
        w = weights(unit, resamples)
        tot = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(est * (w @ s.good.astype(float)) / s.good.sum() * s.n / tot
                              if s.good.sum() else np.zeros(resamples), dtype=float)
    if m.name in COST_BASE:  # price / throughput: the throughput's resamples, transformed
        base_name, scale = COST_BASE[m.name]
        rate = bootstrap(s, METRIC_BY_NAME[base_name], resamples, rng, resample)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.where(rate > 0, (s.cost_per_hour or 0.0) / (rate * 3600.0) * scale, np.nan),
                              dtype=float)
    # throughput: resample blocks of time; the estimate scales with the resampled total
    if m.name == "output_tps":
        weight = s.tokens
    elif m.name == "request_rps":
        weight = np.ones(s.n)
    else:
        assert s.good is not None
        weight = s.good.astype(float)
    per = np.bincount(blocks, weights=weight, minlength=int(blocks.max()) + 1)
    total = per.sum()
    if total <= 0:
        return np.zeros(resamples)
    if s.block_off is not None and len(s.block_off) > 2 and s.block_dur is not None:
        # runs, then blocks within each: the resampled total over the resampled time (blocks differ in length
        # between runs)
        w = _run_weights(rng, s.block_off, resamples).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray((w @ per) / (w @ s.block_dur), dtype=float)
    picks = rng.integers(0, len(per), (resamples, len(per)))
    return np.asarray(est * per[picks].sum(axis=1) / total, dtype=float)



def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (the run-level interval's multiplier): the CDF inverted by bisection to
    1e-12, so scipy is not needed for one quantile (tests/test_compare_repeat.py checks it against tables)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"student_t_ppf({p}, {df}): p must be in (0, 1) and df positive")
    if p < 0.5:
        return -student_t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0

