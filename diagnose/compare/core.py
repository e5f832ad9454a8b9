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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnose.analysis import Analysis
from diagnose.compare.records import (
    Changed,
    Comparability,
    FindingChange,
    GateRow,
    Pictures,
    Quality,
    Spread,
    TraceRow,
)
from diagnose.compare.samples import (
    COST_METRICS,
    METRIC_BY_NAME,
    METRICS,
    Better,
    LevelSample,
    MetricDef,
    Resample,
    _num,
    _too_few,
    bootstrap,
    level_sample,
    point,
    run_levels,
    spread,
    student_t_ppf,
)
from diagnose.errors import InputError
from diagnose.io.manifest import Workload
from diagnose.model import Window
from diagnose.signals.cost import parse_price, recorded_price
from diagnose.signals.workload_card import server_warmth


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
    if m.unit == "ms" and (a <= 0.0) != (b <= 0.0):
        # a latency of 0 ms beside a positive one is an artefact (a client that read every chunk at once), never
        # "better" (issue 38: "ITL P50 5.7 -> 0 ms, better" from a client-bound run)
        verdict = "not comparable"
    elif short:
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


def _flat(prefix: str, d: Any) -> dict[str, str | int | float | bool | None]:
    if not isinstance(d, dict):
        return {}
    out: dict[str, str | int | float | bool | None] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(key + ".", v))
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[key] = v
    return out


def comparability(a: Analysis, b: Analysis, la: Sequence[LevelSample], lb: Sequence[LevelSample],
                  noise: float = NOISE) -> Comparability:
    """What must match (model, engine, workload shape, load levels, valid client runs) and what differs
    (engine settings, engine version): the variables the comparison is about. ``noise``: the comparison's
    noise band, the size of a host's change of speed that is reported (``host_notes``)."""
    ta, tb = a.meta.target, b.meta.target
    wla, wlb = (an.meta.workload or Workload() for an in (a, b))
    wa, wb = wla.shape(WORKLOAD_KEYS), wlb.shape(WORKLOAD_KEYS)
    problems: list[str] = []
    for key, va, vb in (("engine", ta.engine, tb.engine), ("model", ta.model, tb.model)):
        if va != vb:
            problems.append(f"{key} differs: {va!r} vs {vb!r}")
    for key in WORKLOAD_KEYS:
        if wa[key] != wb[key]:
            problems.append(f"workload {key} differs: {wa[key]!r} vs {wb[key]!r}")
    for name, an in (("A", a), ("B", b)):
        if not an.run_valid:
            problems.append(f"run {name} is invalid ({an.verdict.headline if an.verdict else 'no verdict'})")
    levels_a = {(s.kind, s.level) for s in la}
    levels_b = {(s.kind, s.level) for s in lb}
    only_a = sorted(_level_text(k) for k in levels_a - levels_b)
    only_b = sorted(_level_text(k) for k in levels_b - levels_a)
    changed: list[Changed] = []
    fa = {**_flat("engine_config.", ta.engine_config), "engine_version": ta.engine_version}
    fb = {**_flat("engine_config.", tb.engine_config), "engine_version": tb.engine_version}
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            changed.append({"what": key, "a": fa.get(key), "b": fb.get(key)})
    warmth = [server_warmth(an) for an in (a, b)]
    if None not in warmth and (warmth[0] or "").startswith("cold") != (warmth[1] or "").startswith("cold"):
        # a cold server (first-seen batch shapes, empty caches) is slower than a warm one: a variable too
        changed.append({"what": "server warmth", "a": warmth[0], "b": warmth[1]})
    if wla.logprobs != wlb.logprobs:  # attach --logprobs: the engine and the server do more per token (SCH014)
        changed.append({"what": "workload.logprobs", "a": wla.logprobs, "b": wlb.logprobs})
    slo_a, slo_b = dict(a.meta.options.slo), dict(b.meta.options.slo)
    if slo_a != slo_b:
        changed.append({"what": "options.slo", "a": slo_a, "b": slo_b})
    if not changed:
        attribution = "no recorded setting differs: a difference is run-to-run variation or an unrecorded change"
    elif len(changed) == 1:
        attribution = f"one variable changed ({changed[0]['what']}): differences can be attributed to it"
    else:
        attribution = (f"{len(changed)} variables changed ({', '.join(c['what'] for c in changed)}): "
                       "a difference cannot be attributed to one of them")
    drift = host_notes(a, b, same_setting=not changed, noise=noise)
    if problems:  # nothing is attributed between runs that are not comparable (issue 38)
        attribution = "not comparable: no difference is attributed to a setting"
    elif drift and changed:  # "one variable changed" beside "the host ran at another speed" contradicted itself
        attribution = (f"{len(changed)} recorded variable(s) changed ({', '.join(c['what'] for c in changed)}), "
                       "and the host ran at a different speed (below): a difference cannot be attributed to the "
                       "setting alone")
    return {"comparable": not problems, "problems": problems, "changed": changed, "attribution": attribution,
            "levels_only_in_a": only_a, "levels_only_in_b": only_b, "host_drift": drift}


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


def host_notes(a: Analysis, b: Analysis, same_setting: bool, noise: float = NOISE) -> list[str]:
    """What says the host ran at another speed between A and B. With a setting changed: the concurrency-1
    reference (``host_drift``). With none changed, the engine's CPU per output token over the measured runs
    themselves (``work_drift``) is the better witness where both runs measured it: the reference is a few
    seconds of 8 requests, and on a 2-core VM it moved 18-44% in four A/A pairs running whose measured runs
    agreed (every metric "no significant change", CPU per token within the runs' own spread); the reference
    is then not reported. Where CPU per token is not measured (no host probe), the reference decides."""
    if not same_setting:
        return host_drift(a, b)
    ra, rb = _runs_cpu_per_token(a), _runs_cpu_per_token(b)
    if set(ra) & set(rb):
        return work_drift(ra, rb, noise)
    return host_drift(a, b)




def _cpu_per_token(a: Analysis, window: Window) -> float | None:
    """Engine CPU-seconds per output token over ``window``: the CPU all engine processes used (host probe,
    whole sampling intervals inside the window) over the output tokens the client received in it."""
    th = a.tables.get("host_threads")
    if th is None or th.empty:
        return None
    rows = th[(th["t0_s"] >= window.start_s) & (th["t_s"] <= window.end_s)]
    wall = float(rows["t_s"].max() - rows["t0_s"].min()) if len(rows) else 0.0
    s = level_sample(a.tables, window, "", "", None)
    if wall <= 0 or s is None or s.span_s <= 0 or s.tokens.sum() <= 0:
        return None
    return float(rows["cpu_s"].sum()) / wall / (float(s.tokens.sum()) / s.span_s)


def _runs_cpu_per_token(a: Analysis) -> dict[tuple[str, float | None], list[float]]:
    out: dict[tuple[str, float | None], list[float]] = {}
    for p in a.phases:
        if not p.is_baseline:
            v = _cpu_per_token(a, p.window())
            if v is not None and math.isfinite(v) and v > 0:
                out.setdefault(p.level_key, []).append(v)
    return out


def work_drift(ra: dict[tuple[str, float | None], list[float]],
               rb: dict[tuple[str, float | None], list[float]], noise: float = NOISE) -> list[str]:
    """Where no recorded setting differs (an A/A pair, a rerun): the engine's CPU time per output token at a
    load level (``_runs_cpu_per_token`` of A and of B), the same work on the same engine, moved by more than
    the noise band (``noise``, 10% by default) with every run of B beyond every run of A. The cores then
    delivered less (or more) work per second: a slower, shared or stolen core that the guest's steal counter
    need not show (CI: an A/A pair whose second capture's three runs were all 26% slower in throughput, the
    engine using 39% more CPU per token, the concurrency-1 reference within 10%). The bound is the band a
    verdict must clear: a host whose work per second moved by more than the band can by itself make a
    latency or throughput change clear it (CI, stop 41: an A/A pair, output tokens/s -12% on the same
    engine CPU, about +13% CPU per token, then under a 15% bound, and ITL P50 +25% called "worse" with
    nothing naming the host). Reported like ``host_drift``; verdicts are untouched."""
    out = []
    for key in sorted(set(ra) & set(rb), key=lambda k: (k[0], -1.0 if k[1] is None else k[1])):
        va, vb = ra[key], rb[key]
        rel = float(np.median(vb) / np.median(va) - 1.0)
        apart = min(vb) > max(va) or max(vb) < min(va)
        if abs(rel) > noise and apart:
            where = key[0] if key[1] is None else _level_text(key)
            out.append(f"at {where} the engine used {rel:+.0%} CPU time per output token "
                       f"({np.median(va) * 1e3:.3g} -> {np.median(vb) * 1e3:.3g} CPU-ms, every run) with no "
                       f"setting changed: the host's cores delivered {'less' if rel > 0 else 'more'} work per "
                       f"second, so latency and throughput differences of that size may be the host's")
    return out


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


def findings_diff(a: Analysis, b: Analysis) -> list[FindingChange]:
    """Per rule that fired in either run: appeared, disappeared, severity changed, share changed, unchanged."""
    fa = {f.rule_id: f for f in a.findings if not f.held_back}
    fb = {f.rule_id: f for f in b.findings if not f.held_back}
    rows: list[FindingChange] = []
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
    spread_a: dict[str, Spread] = field(default_factory=dict)  # ``spread``: run-to-run, per metric
    spread_b: dict[str, Spread] = field(default_factory=dict)


@dataclass
class Comparison:
    a: str
    b: str
    confidence: float
    resamples: int
    seed: int
    resample: str
    comparability: Comparability
    levels: list[LevelDiff]
    findings: list[FindingChange]
    gate: list[GateRow] = field(default_factory=list)
    trace: list[TraceRow] = field(default_factory=list)
    judgements: list[str] = field(default_factory=list)  # cost against speed and the SLO (--cost-per-hour)
    noise: float = NOISE
    # the quality guard (diagnose/compare/quality.py): output agreement and a --quality-cmd score; None: neither
    quality: Quality | None = None
    pictures: Pictures = field(default_factory=lambda: Pictures())  # what the page draws (diagnose/compare/pictures.py)
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
                "quality": self.quality, "pictures": self.pictures, "regression": any(g["regressed"] for g in self.gate),
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
        comp: Comparability = {
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
    comp = comparability(a, b, la, lb, noise)
    if not pairs:
        comp["comparable"] = False
        comp["problems"] = [*comp["problems"], "no load level is common to both runs"]
    if not comp["comparable"]:
        withhold_verdicts(levels)
    out = Comparison(a.source, b.source, confidence, resamples, seed, resample, comp, levels, findings_diff(a, b),
                     trace=traces)
    out.noise = noise
    out.samples = {sa.label: (sa, sb) for sa, sb in pairs}
    from diagnose.compare.pictures import pictures

    out.pictures = pictures(out)
    if cost_per_hour is not None:
        out.judgements = cost_judgements(out, b)
    return out


JUDGED = ("better", "worse", "within noise")
NOT_JUDGED = "not judged (runs not comparable)"


def withhold_verdicts(levels: Sequence[LevelDiff]) -> None:
    """Runs that are not comparable (another model or workload, an invalid run: a client-bound run's ITL of 0 ms)
    get no better / worse: the values and intervals stay, the verdict says why there is none (issue 38: an
    invalid run's "ITL P50 5.7 -> 0 ms" was called better)."""
    for lv in levels:
        for m in lv.metrics:
            if m.verdict in JUDGED:
                m.verdict = NOT_JUDGED


def cost_judgements(c: Comparison, b: Analysis) -> list[str]:
    """A speed-up that costs more per useful request, or a saving that breaks the SLO, is no gain."""
    slo = b.meta.options.slo
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


def trace_diff(a: Analysis, b: Analysis) -> list[TraceRow]:
    """Two traces: GPU time per kernel class and step duration per step kind, A beside B (no interval: one
    trace is one sample of steps, and kernels of one step are not independent)."""
    rows: list[TraceRow] = []
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
    for name, what, unit in TRACE_DIFF_SIGNALS:  # whole-trace figures, each computed once by the trace analysis
        sa, sb = a.signals.get(name), b.signals.get(name)
        if sa is None and sb is None:
            continue
        nd = 4 if unit == "ratio" else 3  # shown as measured to the trace's resolution
        x = round(float(sa.value), nd) if sa is not None else math.nan
        y = round(float(sb.value), nd) if sb is not None else math.nan
        rows.append({"what": what, "unit": unit, "a": _num(x), "b": _num(y), "diff": _num(round(y - x, nd)),
                     "rel": _num(y / x - 1.0) if x else None})
    return rows


# trace signals shown side by side for two traces (issue 35): per-step time, GPU busy, communication, peer
# wait, host stall
TRACE_DIFF_SIGNALS = (("trace_steps_count", "steps counted", "count"),
                      ("trace_step_dur_p50_ms", "step P50, all counted steps", "ms"),
                      ("trace_gpu_busy_ratio", "GPU busy share of the window", "ratio"),
                      ("trace_gpu_comm_exposed_ratio", "exposed communication share of the window", "ratio"),
                      ("trace_comm_wait_ratio", "communication time waiting for peers", "ratio"),
                      ("trace_host_stall_p50_ms", "host stall per step, P50", "ms"),
                      ("trace_host_stall_step_ratio", "host stall share of step time", "ratio"))


def parse_cost(spec: str) -> tuple[float, float]:
    """``2.5`` (both runs) or ``2.5,4`` (A, B) -> prices per hour; each may be per device-hour x devices
    (``4.1x8``, diagnose.signals.cost.parse_price)."""
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
    pa, pb = recorded_price(a.meta), recorded_price(b.meta)
    return (pa, pb) if pa is not None and pb is not None else None


