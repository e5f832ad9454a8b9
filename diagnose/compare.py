"""Two runs side by side: per matched load level, the difference of every latency percentile, throughput and
goodput with a bootstrap confidence interval, a verdict per metric, a comparability check, and the findings
diff (docs/compare.md).

The point estimates are the analysis's own numbers: the requests that count in a level are chosen by
``diagnose.requests.select`` and the percentiles by ``diagnose.requests.percentiles``, exactly as the client
signals are (tests/test_compare.py checks them against ``Analysis.phase_signals``). Intervals:

* by default (``resample="blocks"``) every metric resamples **blocks of time**: the level's span is cut into
  equal blocks (20 to 60 of them, each at least 0.5 s and, where the span allows, as long as the median
  E2E) and each request is counted in the block where it ended; a resample draws blocks with replacement and
  takes all their requests (with all their token gaps for ITL). Requests of a loaded server are not
  independent (a queue persists from one request to the next): blocks keep that dependence inside a block,
  so the intervals are wider and honest where resampling requests would be too narrow;
* ``resample="requests"`` resamples **requests** with replacement for the latency percentiles and
  ``goodput_ratio`` (each request with all its token gaps for ITL), and blocks of time for the throughputs
  (``output_tps``, ``request_rps``, ``goodput_rps``), which have no per-request value.

* a level run several times in one capture (``attach --repeat N``) is resampled in **two stages**: the runs
  with replacement, then the blocks (or requests) within each drawn run. The spread between the runs, a host
  that drifted over the capture, then widens the interval the way it separates two captures; one run's
  blocks alone would not see it. Each run's values of a few headline metrics and their range as a share of
  the median run are reported (``spread``).

A and B are resampled independently; the interval of the difference (B - A) and of the relative change
(B / A - 1) is the percentile interval of the resampled differences. A metric is *better* or *worse* only
when its interval excludes zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from diagnose.analysis import Analysis
from diagnose.cost import COST_BASE, parse_price, per_unit, recorded_price
from diagnose.errors import InputError
from diagnose.experiments import describe
from diagnose.model import Cause, Finding, Phase, Signal, Window
from diagnose.requests import percentiles, select, span_s
from diagnose.workload_card import server_warmth

Better = Literal["lower", "higher"]
Resample = Literal["requests", "time blocks"]


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


def spread(s: LevelSample) -> dict[str, dict[str, Any]]:
    """Run-to-run spread of a repeated level: each run's value of a few headline metrics and their range as a
    share of the median run, (max - min) / median. Empty for a level measured once."""
    if len(s.repeats) < 2:
        return {}
    out: dict[str, dict[str, Any]] = {}
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


@dataclass
class MetricDiff:
    metric: str
    unit: str
    better: Better
    resampled: Resample
    a: float
    b: float
    diff: float
    diff_lo: float
    diff_hi: float
    rel: float
    rel_lo: float
    rel_hi: float
    # "better" | "worse" (the interval of the relative change lies wholly beyond the noise band) | "within noise"
    # (significant, but not beyond the band) | "no significant change" | "too few requests" | "not comparable"
    verdict: str
    significant: str = ""  # "up" | "down": the interval of the difference excludes zero (the CI gate reads this)
    # "bootstrap", or "runs' t" where a repeated level's interval is Student's t over its runs (``run_interval``),
    # wider than the bootstrap's on at least one side
    interval: str = "bootstrap"

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


NOISE = 0.10  # default run-to-run noise band (docs/compare.md: measured A/A drift on the real engine)


def diff_metric(sa: LevelSample, sb: LevelSample, m: MetricDef, confidence: float, resamples: int,
                rng: np.random.Generator, resample: str = "blocks", noise: float = NOISE) -> MetricDiff:
    a, b = point(sa, m), point(sb, m)
    nan = math.nan
    how: Resample = "requests" if resample == "requests" and m.resample == "requests" else "time blocks"
    if not (math.isfinite(a) and math.isfinite(b)):
        return MetricDiff(m.name, m.unit, m.better, how, a, b, nan, nan, nan, nan, nan, nan, "not comparable")
    ba, bb = bootstrap(sa, m, resamples, rng, resample), bootstrap(sb, m, resamples, rng, resample)
    d = bb - ba
    ok = np.isfinite(d)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = (np.quantile(d[ok], [alpha, 1 - alpha]) if ok.sum() >= 20 else (nan, nan))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = bb / ba - 1.0
    rok = np.isfinite(r)
    rlo, rhi = (np.quantile(r[rok], [alpha, 1 - alpha]) if rok.sum() >= 20 else (nan, nan))
    rel = b / a - 1.0 if a != 0 else nan
    runs_iv = run_interval(sa, sb, m, confidence)
    interval = "bootstrap"
    if runs_iv is not None and math.isfinite(rlo) and math.isfinite(rhi):
        # the wider of the two: with a few runs the two-stage bootstrap under-covers (``run_interval``)
        if runs_iv[0] < rlo or runs_iv[1] > rhi:
            interval = "runs' t"
        rlo, rhi = min(float(rlo), runs_iv[0]), max(float(rhi), runs_iv[1])
        lo, hi = min(float(lo), a * runs_iv[0]), max(float(hi), a * runs_iv[1])
    verdict = "no significant change"
    short = _too_few(sa, m) or _too_few(sb, m)
    significant = ""
    if math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0):
        significant = "up" if lo > 0 else "down"
    if short:
        verdict = "too few requests"
    elif not (math.isfinite(lo) and math.isfinite(hi)):
        verdict = "not comparable" if a != b else "no significant change"
    elif significant:
        beyond = _beyond(float(rlo), float(rhi), noise) if math.isfinite(rlo) and math.isfinite(rhi) else significant
        if beyond:
            verdict = "better" if (beyond == "up") == (m.better == "higher") else "worse"
        else:
            verdict = "within noise"
    return MetricDiff(m.name, m.unit, m.better, how, a, b, b - a, float(lo), float(hi), rel,
                      float(rlo), float(rhi), verdict, significant, interval)


def run_interval(sa: LevelSample, sb: LevelSample, m: MetricDef, confidence: float) -> tuple[float, float] | None:
    """The ``confidence`` interval of the relative change (B / A - 1) from the runs' own values, when a level
    was run several times (``--repeat``): Student's t interval on the difference of the mean log value per
    run, with the run-to-run variance pooled over the sides that were repeated (one side's stands for both
    when only it was) and their degrees of freedom. None when neither side was repeated, or a run's value is
    missing or not positive.

    The two-stage bootstrap cannot see more run-to-run spread than the few runs show, and reads 3 runs as if
    they were all the runs there could be: CI had an A/A pair whose B runs spread 56% in ITL P50 (A's 2%), and
    the bootstrap's interval of ITL P90, +14% to +85%, called a setting that had not changed "worse". On
    synthetic A/A pairs of 3 runs each, its 95% intervals held the true difference in 92 of 100 trials with
    the host 10% off per run and 86 with 20%; with this interval beside it, 96 and 97
    (tests/test_compare_repeat.py). ``diff_metric`` takes the wider of the two, so this one only widens."""
    if sa.runs < 2 and sb.runs < 2:
        return None
    va = [point(r, m) for r in (sa.repeats or [sa])]
    vb = [point(r, m) for r in (sb.repeats or [sb])]
    if not all(math.isfinite(v) and v > 0 for v in (*va, *vb)):
        return None
    la, lb = np.log(va), np.log(vb)
    repeated = [x for x in (la, lb) if len(x) > 1]
    df = sum(len(x) - 1 for x in repeated)
    var = sum(float(np.var(x, ddof=1)) * (len(x) - 1) for x in repeated) / df
    se = math.sqrt(var * (1.0 / len(la) + 1.0 / len(lb)))
    if not se > 0:
        return None
    half = student_t_ppf(0.5 + confidence / 2.0, df) * se
    d = float(lb.mean() - la.mean())
    return math.expm1(d - half), math.expm1(d + half)


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


def _beyond(rel_lo: float, rel_hi: float, noise: float) -> str:
    """"up" / "down" when the whole interval of the relative change lies beyond the noise band, else ""."""
    if rel_lo > noise:
        return "up"
    if rel_hi < -noise:
        return "down"
    return ""


# -- comparability and findings -----------------------------------------------------------------------------
WORKLOAD_KEYS = ("api", "mode", "input_tokens", "output_tokens", "arrival", "burstiness", "shared_prefix_fraction",
                 "ignore_eos")


def _flat(prefix: str, d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(key + ".", v))
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[key] = v
    return out


def comparability(a: Analysis, b: Analysis, la: Sequence[LevelSample], lb: Sequence[LevelSample]) -> dict[str, Any]:
    """What must match (model, engine, workload shape, load levels, valid client runs) and what differs
    (engine settings, engine version): the variables the comparison is about."""
    ta, tb = a.manifest.get("target") or {}, b.manifest.get("target") or {}
    wa, wb = a.manifest.get("workload") or {}, b.manifest.get("workload") or {}
    problems: list[str] = []
    for key in ("engine", "model"):
        if ta.get(key) != tb.get(key):
            problems.append(f"{key} differs: {ta.get(key)!r} vs {tb.get(key)!r}")
    for key in WORKLOAD_KEYS:
        if isinstance(wa, dict) and isinstance(wb, dict) and wa.get(key) != wb.get(key):
            problems.append(f"workload {key} differs: {wa.get(key)!r} vs {wb.get(key)!r}")
    for name, an in (("A", a), ("B", b)):
        if not an.run_valid:
            problems.append(f"run {name} is invalid ({an.verdict.headline if an.verdict else 'no verdict'})")
    levels_a = {(s.kind, s.level) for s in la}
    levels_b = {(s.kind, s.level) for s in lb}
    only_a = sorted(_level_text(k) for k in levels_a - levels_b)
    only_b = sorted(_level_text(k) for k in levels_b - levels_a)
    changed: list[dict[str, Any]] = []
    fa = {**_flat("engine_config.", ta.get("engine_config")), "engine_version": ta.get("engine_version")}
    fb = {**_flat("engine_config.", tb.get("engine_config")), "engine_version": tb.get("engine_version")}
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            changed.append({"what": key, "a": fa.get(key), "b": fb.get(key)})
    warmth = [server_warmth(an) for an in (a, b)]
    if None not in warmth and (warmth[0] or "").startswith("cold") != (warmth[1] or "").startswith("cold"):
        # a cold server (first-seen batch shapes, empty caches) is slower than a warm one: a variable too
        changed.append({"what": "server warmth", "a": warmth[0], "b": warmth[1]})
    slo_a = (a.manifest.get("options") or {}).get("slo") or {}
    slo_b = (b.manifest.get("options") or {}).get("slo") or {}
    if slo_a != slo_b:
        changed.append({"what": "options.slo", "a": slo_a, "b": slo_b})
    if not changed:
        attribution = "no recorded setting differs: a difference is run-to-run variation or an unrecorded change"
    elif len(changed) == 1:
        attribution = f"one variable changed ({changed[0]['what']}): differences can be attributed to it"
    else:
        attribution = (f"{len(changed)} variables changed ({', '.join(c['what'] for c in changed)}): "
                       "a difference cannot be attributed to one of them")
    return {"comparable": not problems, "problems": problems, "changed": changed, "attribution": attribution,
            "levels_only_in_a": only_a, "levels_only_in_b": only_b, "host_drift": host_drift(a, b)}


HOST_DRIFT_MIN = 0.10  # a reference phase that moved more than this between the runs is reported


def host_drift(a: Analysis, b: Analysis) -> list[str]:
    """The baseline phase (sequential requests at concurrency 1, sent first by `attach`) is the same load in
    both runs and, for most settings, unaffected by the one changed (a batch cap, a token budget): when its
    ITL P50 moved by more than 10%, the host ran at a different speed between the runs, and a difference of
    that size elsewhere may be the host's, not the setting's. Reported, never used to change a compare verdict (a
    setting that does change single-request speed moves the reference for real); ``verify`` reads it through
    ``host_confound``."""
    ref = reference_drift(a, b)
    if ref is None:
        return []
    va, vb, rel = ref
    return [f"the concurrency-1 reference phase (the same load in both runs) moved: ITL P50 "
            f"{va:.2f} -> {vb:.2f} ms ({rel:+.0%}); the host may have run at a different "
            f"speed, so differences of that size may be the host's rather than the setting's"]


REFERENCE_RESAMPLES = 1000  # the reference's interval: a fixed seed and count, so a pair always gets one answer


def _reference_sample(a: Analysis) -> LevelSample | None:
    """The requests of the run's concurrency-1 reference phase (None without exactly one, or without rows)."""
    base = [p for p in a.phases if p.is_baseline]
    if len(base) != 1:
        return None
    return level_sample(a.tables, base[0].window(), "reference", "concurrency", 1.0)


def reference_drift(a: Analysis, b: Analysis, confidence: float = 0.95) -> tuple[float, float, float] | None:
    """(A's, B's baseline ITL P50, B's relative move) when it moved beyond HOST_DRIFT_MIN, else None.

    Beyond means the whole ``confidence`` interval of the move (resampling the reference's requests, as
    every other metric's interval) lies outside +-HOST_DRIFT_MIN: the reference is a few seconds of 8
    sequential requests, and on a busy host a burst that slows two of them moved its point value 24-61% in
    CI while the loaded phase held; a point threshold called that a host of another speed in 4 A/A pairs
    running. A host that ran slower throughout moves every request, and the interval with it. Without the
    reference's rows (a bundle analysed from signals only) the point values decide."""
    sa, sb = a.signals.get("baseline_itl_p50_ms"), b.signals.get("baseline_itl_p50_ms")
    if sa is None or sb is None or not (sa.value > 0 and math.isfinite(sb.value)):
        return None
    rel = sb.value / sa.value - 1.0
    if abs(rel) <= HOST_DRIFT_MIN:
        return None
    ra, rb = _reference_sample(a), _reference_sample(b)
    if ra is not None and rb is not None and ra.n and rb.n:
        d = diff_metric(ra, rb, METRIC_BY_NAME["itl_p50"], confidence, REFERENCE_RESAMPLES,
                        np.random.default_rng(0), "requests", HOST_DRIFT_MIN)
        if d.verdict not in ("better", "worse"):
            return None
    return (sa.value, sb.value, rel)


def _level_text(k: tuple[str, float | None]) -> str:
    kind, level = k
    return "run" if level is None else f"{'c=' if kind == 'concurrency' else 'rate='}{level:g}"


def findings_diff(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    """Per rule that fired in either run: appeared, disappeared, severity changed, share changed, unchanged."""
    fa = {f.rule_id: f for f in a.findings if not f.held_back}
    fb = {f.rule_id: f for f in b.findings if not f.held_back}
    rows = []
    for rid in sorted(set(fa) | set(fb)):
        x, y = fa.get(rid), fb.get(rid)
        if x is None and y is not None:
            change = "appeared"
        elif y is None and x is not None:
            change = "disappeared"
        elif x is not None and y is not None and x.severity != y.severity:
            change = "severity changed"
        elif (x is not None and y is not None and x.share is not None and y.share is not None
              and abs(x.share - y.share) >= 0.1):
            change = "share changed"
        else:
            change = "unchanged"
        rows.append({"rule": rid, "change": change, "title_a": x.title if x else None,
                     "title_b": y.title if y else None, "severity_a": x.severity if x else None,
                     "severity_b": y.severity if y else None, "share_a": x.share if x else None,
                     "share_b": y.share if y else None})
    order = {"appeared": 0, "disappeared": 1, "severity changed": 2, "share changed": 3, "unchanged": 4}
    return sorted(rows, key=lambda r: (order[r["change"]], r["rule"]))


# -- the comparison -----------------------------------------------------------------------------------------
@dataclass
class LevelDiff:
    label: str
    n_a: int
    n_b: int
    metrics: list[MetricDiff]
    runs_a: int = 1  # runs of this level in each capture (--repeat)
    runs_b: int = 1
    spread_a: dict[str, dict[str, Any]] = field(default_factory=dict)  # ``spread``: run-to-run, per metric
    spread_b: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Comparison:
    a: str
    b: str
    confidence: float
    resamples: int
    seed: int
    resample: str
    comparability: dict[str, Any]
    levels: list[LevelDiff]
    findings: list[dict[str, Any]]
    gate: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    judgements: list[str] = field(default_factory=list)  # cost against speed and the SLO (--cost-per-hour)
    noise: float = NOISE
    # per level label, the two samples compared (the gate's separation test reads them; not in the JSON)
    samples: dict[str, tuple[LevelSample, LevelSample]] = field(default_factory=dict, repr=False)

    def metric(self, name: str, level: str | None = None) -> MetricDiff:
        for lv in self.levels:
            if level is None or lv.label == level:
                for m in lv.metrics:
                    if m.metric == name:
                        return m
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "confidence": self.confidence, "resamples": self.resamples,
                "seed": self.seed, "resample": self.resample, "comparability": self.comparability,
                "levels": [{"level": lv.label, "requests_a": lv.n_a, "requests_b": lv.n_b,
                            "runs_a": lv.runs_a, "runs_b": lv.runs_b, "spread_a": lv.spread_a,
                            "spread_b": lv.spread_b, "metrics": [m.to_json() for m in lv.metrics]}
                           for lv in self.levels],
                "findings": self.findings, "gate": self.gate, "trace": self.trace, "judgements": self.judgements, "noise": self.noise,
                "regression": any(g["regressed"] for g in self.gate),
                "gate_undecided": any(g.get("outcome") == "undecided" for g in self.gate)}


def check_options(confidence: float, resamples: int, resample: str) -> None:
    """One-line errors for the statistics' options (before any bundle is read)."""
    if not (math.isfinite(confidence) and 0.5 <= confidence < 1.0):
        raise InputError(f"--confidence {confidence}: use a value in [0.5, 1)")
    if resample not in ("blocks", "requests"):
        raise InputError(f"--resample {resample!r}: use blocks or requests")
    if not 100 <= resamples <= 1_000_000:
        raise InputError(f"--resamples {resamples}: use 100 to 1000000")


def check_noise(noise: float) -> None:
    if not (math.isfinite(noise) and 0.0 <= noise < 1.0):
        raise InputError(f"--noise {noise:g}: use a share in [0, 1), e.g. 0.1 for 10%")


def compare(a: Analysis, b: Analysis, *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
            resample: str = "blocks", metrics: Sequence[MetricDef] = METRICS,
            cost_per_hour: tuple[float, float] | None = None, noise: float = NOISE) -> Comparison:
    """``cost_per_hour``: the price of an hour of A's and of B's deployment; adds the cost metrics and the
    judgement of a change that is faster but costs more per useful request, or cheaper but breaks the SLO."""
    check_options(confidence, resamples, resample)
    check_noise(noise)
    la, lb = run_levels(a), run_levels(b)
    if cost_per_hour is not None:
        for lv, price in ((la, cost_per_hour[0]), (lb, cost_per_hour[1])):
            for smp in lv:
                for part in (smp, *smp.repeats):
                    part.cost_per_hour = price
        metrics = (*metrics, *COST_METRICS)
    traces = trace_diff(a, b)
    if not la and not lb and traces:  # two traces: per kernel class and step kind
        comp: dict[str, Any] = {
            "comparable": True, "problems": [], "changed": [], "levels_only_in_a": [], "levels_only_in_b": [],
            "attribution": "traces: the time per kernel class and per step kind, A beside B"}
        return Comparison(a.source, b.source, confidence, resamples, seed, resample, comp, [], findings_diff(a, b),
                          trace=traces)
    for an, lv in ((a, la), (b, lb)):
        if not lv:
            raise InputError(f"{an.source}: no measured requests to compare (and no trace to compare with)")
    rng = np.random.default_rng(seed)
    by_b = {(s.kind, s.level): s for s in lb}
    levels: list[LevelDiff] = []
    if len(la) == 1 and len(lb) == 1 and (la[0].kind, la[0].level) != (lb[0].kind, lb[0].level):
        pairs = []  # one level each but different loads: nothing is matched (listed as a problem)
    else:
        pairs = [(s, by_b[(s.kind, s.level)]) for s in la if (s.kind, s.level) in by_b]
    for sa, sb in pairs:
        levels.append(LevelDiff(sa.label, sa.n, sb.n, [diff_metric(sa, sb, m, confidence, resamples, rng, resample, noise)
                                                       for m in metrics],
                                sa.runs, sb.runs, spread(sa), spread(sb)))
    comp = comparability(a, b, la, lb)
    if not pairs:
        comp["comparable"] = False
        comp["problems"] = [*comp["problems"], "no load level is common to both runs"]
    out = Comparison(a.source, b.source, confidence, resamples, seed, resample, comp, levels, findings_diff(a, b),
                     trace=traces)
    out.noise = noise
    out.samples = {sa.label: (sa, sb) for sa, sb in pairs}
    if cost_per_hour is not None:
        out.judgements = cost_judgements(out, b)
    return out


def cost_judgements(c: Comparison, b: Analysis) -> list[str]:
    """A speed-up that costs more per useful request, or a saving that breaks the SLO, is no gain."""
    slo = (b.manifest.get("options") or {}).get("slo") or {}
    out = []
    for lv in c.levels:
        by = {m.metric: m for m in lv.metrics}
        cost = by.get("cost_per_good_request") if slo else by.get("cost_per_request")
        if cost is None or cost.verdict == "not comparable":
            continue
        faster = [m.metric for m in lv.metrics if m.unit == "ms" and m.verdict == "better"]
        if faster and cost.verdict == "worse":
            out.append(f"{lv.label}: faster ({', '.join(faster)}) but {cost.metric} is {cost.rel:+.0%} (significant): "
                       "no gain per useful request")
        if cost.verdict == "better" and isinstance(slo, dict):
            broken = []
            for key, limit in slo.items():
                d = by.get(str(key).removesuffix("_ms"))
                if d is not None and isinstance(limit, (int, float)) and math.isfinite(d.b) and d.b > limit \
                        and not (math.isfinite(d.a) and d.a > limit):
                    broken.append(f"{d.metric} {d.b:.1f} {d.unit} > {limit:g}")
            if broken:
                out.append(f"{lv.label}: cheaper ({cost.metric} {cost.rel:+.0%}) but breaks the SLO: "
                           + ", ".join(broken) + ": no gain")
    return out


def trace_diff(a: Analysis, b: Analysis) -> list[dict[str, Any]]:
    """Two traces: GPU time per kernel class and step duration per step kind, A beside B (no interval: one
    trace is one sample of steps, and kernels of one step are not independent)."""
    rows: list[dict[str, Any]] = []
    for table, key, value, what in (("trace_kernel_classes", "class", "total_ms", "GPU time, class "),
                                    ("trace_step_summary", "step_type", "dur_ms_p50", "step P50, kind ")):
        ta, tb = a.tables.get(table), b.tables.get(table)
        if ta is None or tb is None or ta.empty or tb.empty:
            continue
        va = ta.groupby(key)[value].sum() if table == "trace_kernel_classes" else ta.set_index(key)[value]
        vb = tb.groupby(key)[value].sum() if table == "trace_kernel_classes" else tb.set_index(key)[value]
        for k in sorted(set(va.index) | set(vb.index), key=str):
            x, y = float(va.get(k, math.nan)), float(vb.get(k, math.nan))
            rows.append({"what": f"{what}{k}", "unit": "ms", "a": _num(x), "b": _num(y),
                         "diff": _num(y - x), "rel": _num(y / x - 1.0) if x else None})
    return rows


def parse_cost(spec: str) -> tuple[float, float]:
    """``2.5`` (both runs) or ``2.5,4`` (A, B) -> prices per hour; each may be per device-hour x devices
    (``4.1x8``, diagnose.cost.parse_price)."""
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) not in (1, 2):
        raise InputError(f"--cost-per-hour {spec!r}: use one or two positive prices (PRICE or PRICE_A,PRICE_B)")
    try:
        prices = [parse_price(p) for p in parts]
    except InputError:
        raise InputError(f"--cost-per-hour {spec!r}: use one or two positive prices (PRICE or PRICE_A,PRICE_B, "
                         "each PRICE or PRICExDEVICES)") from None
    return (prices[0], prices[-1])


def recorded_prices(a: Analysis, b: Analysis) -> tuple[float, float] | None:
    """The prices per hour both captures recorded (``attach --cost-per-hour``); None unless both did."""
    pa, pb = recorded_price(a.manifest or {}), recorded_price(b.manifest or {})
    return (pa, pb) if pa is not None and pb is not None else None


# -- verify: did the experiment move what its hypothesis says it would? ------------------------------------
METRIC_BY_SIGNAL = {m.signal: m for m in METRICS}


def chosen_cause(f: Finding) -> Cause | None:
    """The cause the verdict names for ``f``: supported before open, never a ruled-out one (as
    rules/verdict.best_cause)."""
    for status in ("supported", "open"):
        for c in f.causes:
            if c.status == status and c.experiment is not None:
                return c
    return None


@dataclass
class Move:
    signal: str
    expect: str  # "down" | "up" | "flat"
    a: float
    b: float
    rel: float
    interval: tuple[float, float] | None  # of the relative change, when the signal has one
    outcome: str  # "as expected" | "opposite" | "no significant change" | "point values only" | "not measured"

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "expect": self.expect, "a": _num(self.a), "b": _num(self.b),
                "rel": _num(self.rel), "rel_lo": _num(self.interval[0]) if self.interval else None,
                "rel_hi": _num(self.interval[1]) if self.interval else None, "outcome": self.outcome}


def _num(v: float) -> float | None:
    return v if isinstance(v, float) and math.isfinite(v) else None


def _move(sig: str, expect: str, c: Comparison, level: str, sa: Mapping[str, Signal],
          sb: Mapping[str, Signal]) -> Move:
    m = METRIC_BY_SIGNAL.get(sig)
    if m is not None:
        d = c.metric(m.name, level)
        iv = (d.rel_lo, d.rel_hi) if math.isfinite(d.rel_lo) and math.isfinite(d.rel_hi) else None
        if d.verdict in ("not comparable",) or iv is None:
            return Move(sig, expect, d.a, d.b, d.rel, iv, "not measured")
        if d.verdict == "too few requests":
            return Move(sig, expect, d.a, d.b, d.rel, iv, "too few requests")
        beyond = _beyond(d.rel_lo, d.rel_hi, c.noise)  # a move counts when it is beyond run-to-run noise
        up, down = beyond == "up", beyond == "down"
        if expect == "flat":
            outcome = "as expected" if not (up or down) else "opposite"
        elif (expect == "up" and up) or (expect == "down" and down):
            outcome = "as expected"
        elif (expect == "up" and down) or (expect == "down" and up):
            outcome = "opposite"
        else:
            outcome = "no significant change"
        return Move(sig, expect, d.a, d.b, d.rel, iv, outcome)
    xa, xb = sa.get(sig), sb.get(sig)
    if xa is None or xb is None or not (xa.is_finite() and xb.is_finite()):
        return Move(sig, expect, xa.value if xa else math.nan, xb.value if xb else math.nan, math.nan, None,
                    "not measured")
    rel = xb.value / xa.value - 1.0 if xa.value else math.nan
    return Move(sig, expect, xa.value, xb.value, rel, None, "point values only")


@dataclass
class Verification:
    finding: str
    title: str
    cause: str
    change: str
    level: str
    outcome: str  # "confirmed" | "refuted" | "inconclusive"
    reason: str
    moves: list[Move]
    finding_after: str  # "gone" | "still fires" | "weaker" | ...
    slo_broken: list[str]
    worse_elsewhere: list[str]
    comparison: Comparison

    @property
    def gain(self) -> bool:
        return self.outcome == "confirmed" and not self.slo_broken

    def headline(self) -> str:
        moved = "; ".join(f"{mv.signal} {mv.rel:+.0%}" + (f" ({self.comparison.confidence:.0%} CI "
                                                           f"{mv.interval[0]:+.0%} to {mv.interval[1]:+.0%})"
                                                           if mv.interval else "")
                          for mv in self.moves if mv.outcome != "not measured" and math.isfinite(mv.rel))
        out = f"{self.outcome}: {self.finding} ({self.cause})" + (f": {moved}" if moved else "")
        if self.slo_broken:
            out += f"; but the change breaks the SLO: {', '.join(self.slo_broken)} (no gain)"
        return out

    def to_json(self) -> dict[str, Any]:
        return {"finding": self.finding, "title": self.title, "cause": self.cause, "change": self.change,
                "level": self.level, "outcome": self.outcome, "reason": self.reason, "headline": self.headline(),
                "moves": [m.to_json() for m in self.moves], "finding_after": self.finding_after,
                "slo_broken": self.slo_broken, "worse_elsewhere": self.worse_elsewhere, "gain": self.gain,
                "comparison": self.comparison.to_json()}


def verify(before: Analysis, after: Analysis, *, finding: str | None = None, confidence: float = 0.95,
           resamples: int = 2000, seed: int = 0, resample: str = "blocks", noise: float = NOISE) -> Verification:
    """Confirm or refute the hypothesis of one finding of BEFORE (default: the verdict's top finding) from
    AFTER, a run with its experiment applied: confirmed when an expected move is significant in its
    direction and none goes the other way; refuted when one goes significantly the other way, or when
    nothing expected moved and the finding still fires; else inconclusive.

    In a closed loop at the same concurrency, a hypothesis that predicts the engine's occupancy to move (more
    requests running, fewer queued) is not confirmed by latencies alone: when the occupancy did not move as
    predicted, the latency moves came from elsewhere and the outcome is refuted (CI: a token-budget change
    under a batch cap of 2 came out "confirmed", which only a latency move could give, the cap holding the
    running requests)."""
    fid = finding or (before.verdict.top_rule if before.verdict else None)
    if not fid:
        raise InputError(f"{before.source}: no finding to verify (the run has no top finding); pass --finding")
    f = next((x for x in before.findings if x.rule_id == fid), None)
    if f is None:
        fired = ", ".join(x.rule_id for x in before.findings) or "none"
        raise InputError(f"{before.source}: finding {fid} did not fire in this run (fired: {fired})")
    cause = chosen_cause(f)
    if cause is None or cause.experiment is None:
        raise InputError(f"{before.source}: finding {fid} has no experiment to verify (every cause is ruled out "
                         "or none names an experiment)")
    c = compare(before, after, confidence=confidence, resamples=resamples, seed=seed, resample=resample,
                noise=noise)
    if not c.levels:
        raise InputError(f"{before.source} and {after.source}: no load level in common; "
                         + "; ".join(c.comparability["problems"]))
    lv = c.levels[-1]  # the highest common load level: where the symptom is largest
    phase_a = _phase_signals(before, lv.label)
    phase_b = _phase_signals(after, lv.label)
    moves = [_move(sig, d, c, lv.label, phase_a, phase_b) for sig, d in cause.experiment.expect]
    judged = [m for m in moves if m.interval is not None and m.outcome not in ("not measured", "too few requests")]
    good = [m for m in judged if m.outcome == "as expected" and m.expect != "flat"]
    bad = [m for m in judged if m.outcome == "opposite"]
    g = next((x for x in after.findings if x.rule_id == fid and not x.held_back), None)
    after_state = "gone" if g is None else ("weaker" if g.score < f.score * 0.8 else "still fires")
    if not c.comparability["comparable"]:
        outcome, reason = "inconclusive", "the runs are not comparable: " + "; ".join(c.comparability["problems"])
    elif bad:
        outcome, reason = "refuted", "moved the other way: " + ", ".join(m.signal for m in bad)
    elif good:
        outcome, reason = "confirmed", "moved as predicted: " + ", ".join(m.signal for m in good)
    elif judged and after_state == "still fires":
        outcome, reason = "refuted", "nothing the hypothesis predicts moved significantly and the finding still fires"
    elif not judged:
        outcome, reason = "inconclusive", "none of the predicted signals has a confidence interval in these runs"
    else:
        outcome, reason = "inconclusive", "no predicted move is significant"
    occupancy = occupancy_moves(before, after, lv.label, moves)
    unmoved = outcome == "confirmed" and bool(occupancy) and not any(
        occupancy_outcome(m, c.noise) == "as expected" for m in occupancy)
    if unmoved:
        # the latencies moved, the engine's admission did not: the change did not act through the hypothesis
        counts = _occupancy_text(occupancy)
        outcome, reason = "refuted", (
            f"in this closed loop at {lv.label} the engine's occupancy did not move as predicted: {counts}; the "
            f"latencies moved as predicted ({', '.join(f'{m.signal} {m.rel:+.0%}' for m in good)}) without the "
            "change the hypothesis names, so something else moved them (the host's speed or run-to-run variation "
            "moves latencies, not how many requests the engine admits)")
    elif outcome in ("confirmed", "refuted"):
        confound = host_confound(before, after, outcome, good, judged, cause.experiment.expect, c.noise, occupancy)
        if confound:
            outcome, reason = "inconclusive", confound
        else:
            drift = reference_drift(before, after)
            if drift is not None and _occupancy_settles(outcome, occupancy, c.noise):
                counts = _occupancy_text(occupancy)
                how = "moved as predicted" if outcome == "confirmed" else "did not move as predicted"
                reason = (f"in this closed loop at {lv.label} the engine's occupancy {how}: {counts}; the host "
                          f"ran at a different speed (the concurrency-1 reference moved {drift[2]:+.0%}), which "
                          f"moves latencies but not how many requests the engine admits, so the latency moves "
                          f"may be partly the host's ({reason})")
    slo = (after.manifest.get("options") or {}).get("slo") or {}
    broken = []
    if isinstance(slo, dict):
        for key, limit in slo.items():
            m = METRIC_BY_NAME.get(str(key).removesuffix("_ms"))  # SLO keys: ttft_p99_ms or ttft_p99
            if m is None or not isinstance(limit, (int, float)):
                continue
            d = next((x for x in lv.metrics if x.metric == m.name), None)
            if d is not None and math.isfinite(d.b) and d.b > limit and not (math.isfinite(d.a) and d.a > limit):
                broken.append(f"{m.name} {d.b:.1f} {m.unit} > {limit:g} {m.unit}")
    expected = {METRIC_BY_SIGNAL[s].name for s, _ in cause.experiment.expect if s in METRIC_BY_SIGNAL}
    elsewhere = [f"{d.metric} {d.rel:+.0%}" for d in lv.metrics if d.verdict == "worse" and d.metric not in expected]
    e = cause.experiment
    variable = describe(e.variable_kind, e.variable, e.value, before.engine) if e.variable else ""
    return Verification(fid, f.title, cause.cause, e.change + (f" (changes {variable})" if variable else ""),
                        lv.label, outcome, reason, moves, after_state, broken, elsewhere, c)


def _speed_signal(sig: str) -> bool:
    """A signal an experiment names when it changes single-request speed (CUDA graphs, a smaller model): then
    the concurrency-1 reference moves for real and is no measure of the host."""
    return sig.startswith(("itl_", "tpot_", "baseline_", "e2e_"))


def host_confound(before: Analysis, after: Analysis, outcome: str, good: Sequence[Move], judged: Sequence[Move],
                  expect: Sequence[tuple[str, str]], noise: float, occupancy: Sequence[Move] = ()) -> str:
    """Why ``outcome`` cannot be told from a change of host speed, or "" when it can.

    The concurrency-1 reference phase is the same load in both runs (``host_drift``). When it moved more than
    HOST_DRIFT_MIN, every latency moved by about that factor for reasons of the host's (CI: the reference 46%
    faster in the second run, TTFT -46%, and a flag that changes nothing "confirmed"). A confirmation stands
    only if one predicted move lies wholly beyond what the host's factor explains, or goes against it; a
    refutation only if the host's change did not push against the prediction (a slower host can mask a real
    gain). Not applied when the experiment itself predicts single-request speed to change.

    Neither holds for ``occupancy`` (``occupancy_moves``): in a closed loop at the same concurrency, how many
    requests the engine runs or queues is set by its admission (the batch cap, the KV blocks), not by how fast
    the host is, so a predicted occupancy move that happened confirms, and one that did not happen refutes,
    whatever the reference did (CI: the reference +139% while a cap that no flag had raised still held the
    running requests at 2 -> 2)."""
    if any(_speed_signal(sig) for sig, _ in expect):
        return ""
    ref = reference_drift(before, after)
    if ref is None or ref[1] <= 0:
        return ""
    va, vb, drift = ref

    def host_factor(m: Move) -> float | None:  # what the host's change alone does to this metric
        md = METRIC_BY_SIGNAL.get(m.signal)
        if md is None:
            return None
        return (1.0 + drift) if md.better == "lower" else 1.0 / (1.0 + drift)

    def explained(m: Move) -> bool:
        f = host_factor(m)
        if f is None or m.interval is None:
            return False
        lo, hi = m.interval
        if m.expect == "down":
            return f < 1.0 and not hi < f * (1.0 - noise) - 1.0
        if m.expect == "up":
            return f > 1.0 and not lo > f * (1.0 + noise) - 1.0
        return False

    def against(m: Move) -> bool:
        f = host_factor(m)
        return f is not None and ((m.expect == "down" and f > 1.0) or (m.expect == "up" and f < 1.0))

    what = (f"the host ran at a different speed: the concurrency-1 reference phase (the same load in both runs) "
            f"moved {drift:+.0%} (ITL P50 {va:.2f} -> {vb:.2f} ms)")
    settled = _occupancy_settles(outcome, occupancy, noise)
    if settled:
        return ""
    if outcome == "confirmed" and good and all(explained(m) for m in good):
        return (f"{what}, as much as the predicted moves ({', '.join(f'{m.signal} {m.rel:+.0%}' for m in good)}); "
                "capture both runs again")
    if outcome == "refuted" and any(against(m) for m in judged):
        return f"{what}, against the predicted moves, which it could mask; capture both runs again"
    return ""


OCCUPANCY = ("running_requests_max", "running_requests_mean", "queue_depth_mean", "queue_depth_max")


def _closed_at(a: Analysis, label: str) -> float | None:
    """The concurrency of the measured phase ``label`` when it is a closed loop, else None."""
    for p in a.phases:
        if not p.is_baseline and _label(p) == label:
            return p.concurrency if p.level_kind == "concurrency" and p.concurrency else None
    return None


def occupancy_moves(before: Analysis, after: Analysis, level: str, moves: Sequence[Move]) -> list[Move]:
    """The predicted moves of engine occupancy (running, queued) when both runs held the same closed-loop
    concurrency at ``level``: counts the host's speed does not set (``host_confound``). Empty otherwise."""
    ca, cb = _closed_at(before, level), _closed_at(after, level)
    if ca is None or ca != cb:
        return []
    return [m for m in moves if m.signal in OCCUPANCY and m.expect in ("up", "down")
            and math.isfinite(m.a) and math.isfinite(m.b)]


def occupancy_outcome(m: Move, noise: float) -> str:
    """"as expected", "opposite" or "no change" for an occupancy point value: a change counts when it is at
    least one request and beyond the noise band (a cap holds a maximum exactly: 2 -> 2)."""
    d = m.b - m.a
    if abs(d) < 1.0 or (m.a > 0 and abs(d) / m.a <= noise):
        return "no change"
    return "as expected" if (d > 0) == (m.expect == "up") else "opposite"


def _occupancy_text(occupancy: Sequence[Move]) -> str:
    return ", ".join(f"{m.signal} {m.a:.3g} -> {m.b:.3g} (expected {m.expect})" for m in occupancy)


def _occupancy_settles(outcome: str, occupancy: Sequence[Move], noise: float) -> bool:
    states = [occupancy_outcome(m, noise) for m in occupancy]
    if outcome == "confirmed":
        return "as expected" in states and "opposite" not in states
    if outcome == "refuted":
        return bool(states) and "as expected" not in states
    return False


def _phase_signals(a: Analysis, label: str) -> Mapping[str, Signal]:
    for p, sig in zip(a.phases, a.phase_signals, strict=False):
        if not p.is_baseline and _label(p) == label:
            return sig
    return a.signals
