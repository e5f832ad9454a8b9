"""Find the SLO edge (``attach --find-max-goodput``): the highest load that still meets the SLO, and where the
server saturates, each with its uncertainty (docs/compare.md, "Finding the SLO edge").

The search measures one load level at a time (``measure(level)``: a capture at that level, analysed by the
normal pipeline, so every number here has the analysis's own definition): a coarse ladder upwards until a
level fails the SLO, then bisection between the last level that met it and the first that did not, until they
are one step apart (concurrency: 1; rate: 10%) or the step budget is spent. A level *meets* the SLO when the
point estimate of every term is within its limit; each term also gets a bootstrap interval (the resampling of
``diagnose compare``), so a level is *clearly* on one side when the whole interval is, and *marginal* when the
interval straddles the limit: the edge is then uncertain by that level, which the result says.

Saturation: the lowest level whose output tok/s is within 5% of the most any level reached (the knee of the
throughput curve); "not reached" when the top level tried still grew more than 5% over the one below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from diagnose import compare as cmp
from diagnose.analysis import Analysis
from diagnose.compare.samples import _PCT, _too_few
from diagnose.errors import InputError
from diagnose.signals.sweep import CURVE_METRICS, SATURATION_SHARE, knee  # noqa: F401 (one definition, re-exported)

RATE_RESOLUTION = 1.10  # bisection of a rate stops when the two sides are within 10%
# past the SLO edge the ladder goes on while output tok/s still grows (no knee yet), at most this many more
# rungs: the saturation is then the plateau, not the last level before the edge (issue 34 item 6)
PLATEAU_LEVELS = 2


def slo_metrics(slo: Mapping[str, float]) -> dict[str, tuple[cmp.MetricDef, float]]:
    """The SLO's terms ('ttft_p99_ms' -> 500) as the metrics compare resamples, with their limits (ms)."""
    if not slo:
        raise InputError("--find-max-goodput needs --slo (e.g. --slo ttft_p99=2s,itl_p99=200ms): the edge is "
                         "the highest load that meets it")
    out: dict[str, tuple[cmp.MetricDef, float]] = {}
    for key, limit in slo.items():
        name = key.removesuffix("_ms")
        base, _, pct = name.rpartition("_")
        if base not in ("ttft", "itl", "tpot", "e2e") or pct not in _PCT:
            raise InputError(f"--slo {key}: --find-max-goodput judges ttft, itl, tpot or e2e at p50, p90, p95 "
                             "or p99")
        out[name] = (cmp.MetricDef(name, "ms", "lower", "requests", key), float(limit))
    return out


@dataclass
class Term:
    value: float
    limit: float
    lo: float  # bootstrap interval of the value (NaN: too few values to resample)
    hi: float
    status: str  # "meets" | "fails" | "marginal" (the interval straddles the limit) | "no value"


@dataclass
class LevelPoint:
    """One measured level of the search, from its capture's analysis."""

    level: float
    label: str
    source: str
    valid: bool  # the capture's analysis judged the run (a starved client measures nothing)
    requests: int
    meets: bool  # every SLO term's point estimate within its limit (and the run valid)
    clear: bool  # every term's interval wholly on the side its point estimate is
    terms: dict[str, Term]
    output_tps: float
    output_tps_lo: float
    output_tps_hi: float
    goodput_rps: float
    goodput_ratio: float
    curve: dict[str, float] = field(default_factory=dict)  # CURVE_METRICS' point values
    step: str = "ladder"  # "ladder" | "bisection"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return _finite(d)


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _interval(s: cmp.LevelSample, m: cmp.MetricDef, resamples: int, rng: np.random.Generator,
              confidence: float) -> tuple[float, float]:
    if _too_few(s, m):
        return math.nan, math.nan
    boot = cmp.bootstrap(s, m, resamples, rng)
    boot = boot[np.isfinite(boot)]
    if boot.size < 20:
        return math.nan, math.nan
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(boot, [a, 1.0 - a])
    return float(lo), float(hi)


def level_point(a: Analysis, level: float, label: str, slo: Mapping[str, float], *, resamples: int = 1000,
                seed: int = 0, confidence: float = 0.95) -> LevelPoint:
    """The SLO judgement and throughput of one capture at one level (its one measured level)."""
    terms_def = slo_metrics(slo)
    levels = cmp.run_levels(a)
    if not levels:
        raise InputError(f"{a.source}: no measured requests at {label}")
    s = levels[-1]  # the capture's one level (a baseline phase is not among them)
    rng = np.random.default_rng(seed)
    terms: dict[str, Term] = {}
    for name, (m, limit) in terms_def.items():
        v = cmp.point(s, m)
        lo, hi = _interval(s, m, resamples, rng, confidence)
        if not math.isfinite(v):
            status = "no value"
        elif math.isfinite(lo) and math.isfinite(hi) and lo <= limit <= hi:
            status = "marginal"
        else:
            status = "meets" if v <= limit else "fails"
        terms[name] = Term(v, limit, lo, hi, status)
    tps_m = cmp.METRIC_BY_NAME["output_tps"]
    tps = cmp.point(s, tps_m)
    tlo, thi = _interval(s, tps_m, resamples, rng, confidence)
    good = {n: cmp.point(s, cmp.METRIC_BY_NAME[n]) for n in ("goodput_rps", "goodput_ratio")}
    valid = a.run_valid
    meets = valid and all(t.status in ("meets", "marginal") and t.value <= t.limit for t in terms.values())
    clear = valid and all(t.status in ("meets", "fails") for t in terms.values())
    return LevelPoint(level=level, label=label, source=a.source, valid=valid, requests=s.n, meets=meets, clear=clear,
                      terms=terms, output_tps=tps, output_tps_lo=tlo, output_tps_hi=thi,
                      goodput_rps=good["goodput_rps"], goodput_ratio=good["goodput_ratio"],
                      curve={n: cmp.point(s, cmp.METRIC_BY_NAME[n]) for n in CURVE_METRICS})


@dataclass
class SearchResult:
    kind: str  # "concurrency" | "rate"
    slo: dict[str, float]
    points: list[LevelPoint]  # in the order measured
    max_goodput: LevelPoint | None  # the highest level that met the SLO
    first_failing: LevelPoint | None  # the lowest level above it that did not
    saturation: LevelPoint | None
    saturation_note: str
    edge_note: str
    stopped: str  # why the search ended

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "slo": self.slo, "points": [p.to_json() for p in self.points],
                "max_goodput": None if self.max_goodput is None else self.max_goodput.label,
                "first_failing": None if self.first_failing is None else self.first_failing.label,
                "saturation": None if self.saturation is None else self.saturation.label,
                "saturation_note": self.saturation_note, "edge": self.edge_note, "stopped": self.stopped}

    def by_level(self) -> list[LevelPoint]:
        return sorted(self.points, key=lambda p: p.level)


def _midpoint(lo: float, hi: float, kind: str) -> float | None:
    """The next level between two measured ones; None when they are one step apart."""
    if kind == "concurrency":
        mid = math.floor((lo + hi) / 2)
        return float(mid) if lo < mid < hi else None
    if hi / lo <= RATE_RESOLUTION:
        return None
    return round(math.sqrt(lo * hi), 3)  # geometric: the ladder is geometric too


def search(measure: Callable[[float, str], LevelPoint], ladder: Sequence[float], kind: str,
           max_bisections: int = 4, max_plateau: int = PLATEAU_LEVELS) -> SearchResult:
    """Up the ``ladder`` until a level fails the SLO, then bisect (at most ``max_bisections`` more levels), then
    on up the ladder past the edge while output tok/s still grows (at most ``max_plateau`` more rungs), so the
    saturation is the throughput's plateau or is said to be at least the top level's."""
    if kind not in ("concurrency", "rate"):
        raise InputError(f"--find-max-goodput searches a concurrency or a rate, not {kind!r}")
    levels = sorted(set(float(v) for v in ladder))
    if not levels:
        raise InputError("--find-max-goodput: no load level to try")
    points: list[LevelPoint] = []
    passed: LevelPoint | None = None
    failed: LevelPoint | None = None
    stopped = "every ladder level met the SLO"
    for v in levels:
        p = measure(v, "ladder")
        points.append(p)
        if p.meets:
            passed = p
        else:
            failed = p
            stopped = f"{p.label} failed the SLO" + ("" if p.clear else " (marginally)")
            break
    if passed is not None and failed is not None:
        for _ in range(max_bisections):
            mid = _midpoint(passed.level, failed.level, kind)
            if mid is None:
                break
            p = measure(mid, "bisection")
            points.append(p)
            if p.meets:
                passed = p
            else:
                failed = p
        gap = _midpoint(passed.level, failed.level, kind)
        stopped += "; bisected to one step" if gap is None else f"; bisection budget ({max_bisections}) spent"
    if passed is None and failed is not None:
        stopped = f"the lowest level tried ({failed.label}) already failed the SLO"
    if passed is not None and failed is not None and max_plateau > 0:
        beyond = [v for v in levels if v > max(p.level for p in points)][:max_plateau]
        went = 0
        for v in beyond:
            if saturation(points)[0] is not None:  # the knee is in what was measured: the plateau is found
                break
            points.append(measure(v, "plateau"))
            went += 1
        if went:
            stopped += f"; {went} level(s) past the edge for the throughput's plateau"
    edge = _edge_note(passed, failed)
    sat, sat_note = saturation(points)
    return SearchResult(kind, {}, points, passed, failed, sat, sat_note, edge, stopped)


def _edge_note(passed: LevelPoint | None, failed: LevelPoint | None) -> str:
    if passed is None:
        return f"no level tried met the SLO (the lowest, {failed.label}, did not)" if failed else "nothing measured"
    if failed is None:
        return f"at least {passed.label}: the highest level tried met the SLO"
    marginal = [f"{p.label} ({', '.join(n for n, t in p.terms.items() if t.status == 'marginal')})"
                for p in (passed, failed) if not p.clear]
    note = f"between {passed.label} (meets the SLO) and {failed.label} (does not)"
    if marginal:
        note += "; uncertain: the interval of " + " and ".join(marginal) + " straddles its limit"
    return note


def saturation(points: Sequence[LevelPoint]) -> tuple[LevelPoint | None, str]:
    """``knee`` over the measured levels, in load order."""
    pts = sorted(points, key=lambda p: p.level)
    i, note = knee([p.label for p in pts], [p.output_tps for p in pts])
    return (None if i is None else pts[i]), note


def summary_lines(r: SearchResult) -> list[str]:
    unit = "" if r.kind == "concurrency" else " req/s"
    lines = []
    if r.max_goodput is not None:
        p = r.max_goodput
        lines.append(f"max goodput: {p.label}{unit}: {p.goodput_rps:.3g} req/s within the SLO, "
                     f"{p.output_tps:.4g} tok/s; edge {r.edge_note}")
    else:
        lines.append(f"max goodput: none: {r.edge_note}")
    lines.append(f"saturation: {r.saturation_note}")
    lines.append(f"search: {len(r.points)} levels measured; {r.stopped}")
    for p in r.by_level():
        terms = ", ".join(f"{n} {t.value:.4g} ms" + (f" [{t.lo:.4g}, {t.hi:.4g}]" if math.isfinite(t.lo) else "")
                          + f" / {t.limit:g} {t.status}" for n, t in p.terms.items())
        lines.append(f"  {p.label:<12} {'meets' if p.meets else 'FAILS':<5} {p.output_tps:8.4g} tok/s  {terms}"
                     + ("" if p.valid else "  (run invalid)"))
    return lines
