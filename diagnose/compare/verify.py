"""verify: split out of diagnose.compare.core."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnose.analysis import Analysis
from diagnose.compare.core import NOISE, Comparison, _beyond, compare, reference_drift
from diagnose.compare.quality import MAX_SCORE_DROP, MIN_AGREEMENT, QUALITY_TIMEOUT_S, quality
from diagnose.compare.quality import check_options as check_quality
from diagnose.compare.records import MoveRecord
from diagnose.compare.samples import METRIC_BY_NAME, METRICS, _label, _num
from diagnose.engines.experiments import describe
from diagnose.errors import InputError
from diagnose.model import Cause, Finding, Signal

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

    def to_json(self) -> MoveRecord:
        return {"signal": self.signal, "expect": self.expect, "a": _num(self.a), "b": _num(self.b),
                "rel": _num(self.rel), "rel_lo": _num(self.interval[0]) if self.interval else None,
                "rel_hi": _num(self.interval[1]) if self.interval else None, "outcome": self.outcome}




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
    xa, xb = _off_is_zero(sig, sa), _off_is_zero(sig, sb)
    if xa is None or xb is None or not (xa.is_finite() and xb.is_finite()):
        return Move(sig, expect, xa.value if xa else math.nan, xb.value if xb else math.nan, math.nan, None,
                    "not measured")
    rel = xb.value / xa.value - 1.0 if xa.value else math.nan
    return Move(sig, expect, xa.value, xb.value, rel, None, "point values only")


def _off_is_zero(sig: str, signals: Mapping[str, Signal]) -> Signal | None:
    """``signals[sig]``; for the prefix cache's hit ratio on a server whose prefix caching is off (it publishes
    no cache queries, so the ratio is not measured), 0: no token was served from a cache that is off."""
    x = signals.get(sig)
    off = signals.get("prefix_caching")
    if x is None and sig == "prefix_cache_hit_ratio" and off is not None and off.value == 0:
        return Signal(sig, 0.0, "ratio", off.source, "prefix caching off: no token served from the cache")
    return x


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
    refuted_by: str = ""  # "quality" | "SLO": a change refuted whatever its latencies did

    @property
    def gain(self) -> bool:
        return self.outcome == "confirmed" and not self.slo_broken

    def headline(self) -> str:
        if self.refuted_by:
            return f"refuted: {self.refuted_by}: {self.finding} ({self.cause}): {self.reason}"
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
                "refuted_by": self.refuted_by, "quality": self.comparison.quality,
                "comparison": self.comparison.to_json()}


def verify(before: Analysis, after: Analysis, *, finding: str | None = None, confidence: float = 0.95,
           resamples: int = 2000, seed: int = 0, resample: str = "blocks", noise: float = NOISE,
           quality_cmd: str | None = None, quality_timeout_s: float = QUALITY_TIMEOUT_S,
           min_agreement: float = MIN_AGREEMENT, max_score_drop: float = MAX_SCORE_DROP) -> Verification:
    """Confirm or refute the hypothesis of one finding of BEFORE (default: the verdict's top finding) from
    AFTER, a run with its experiment applied: confirmed when an expected move is significant in its
    direction and none goes the other way; refuted when one goes significantly the other way, or when
    nothing expected moved and the finding still fires; else inconclusive.

    In a closed loop at the same concurrency, a hypothesis that predicts the engine's occupancy to move (more
    requests running, fewer queued) is not confirmed by latencies alone: when the occupancy did not move as
    predicted, the latency moves came from elsewhere and the outcome is refuted (CI: a token-budget change
    under a batch cap of 2 came out "confirmed", which only a latency move could give, the cap holding the
    running requests).

    The quality guard (diagnose/compare/quality.py) comes last: outputs that no longer agree, or a
    ``quality_cmd`` score that fell, make any outcome "refuted" (refuted_by "quality"); a quality command that
    failed leaves a confirmation "inconclusive". A change that breaks the SLO (a term A met, or goodput
    significantly down) is never "confirmed": it is refuted (refuted_by "SLO")."""
    check_quality(min_agreement, max_score_drop, quality_timeout_s)
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
            f"{_occupancy_where(occupancy, lv.label)} did not move as predicted: {counts}; the "
            f"latencies moved as predicted ({', '.join(f'{m.signal} {m.rel:+.0%}' for m in good)}) without the "
            "change the hypothesis names, so something else moved them (the host's speed or run-to-run variation "
            "moves latencies, not how many requests the engine admits or how often its cache hits)")
    elif outcome in ("confirmed", "refuted"):
        confound = host_confound(before, after, outcome, good, judged, cause.experiment.expect, c.noise, occupancy)
        if confound:
            outcome, reason = "inconclusive", confound
        else:
            drift = reference_drift(before, after)
            if drift is not None and _occupancy_settles(outcome, occupancy, c.noise):
                counts = _occupancy_text(occupancy)
                how = "moved as predicted" if outcome == "confirmed" else "did not move as predicted"
                reason = (f"{_occupancy_where(occupancy, lv.label)} {how}: {counts}; the host "
                          f"ran at a different speed (the concurrency-1 reference moved {drift[2]:+.0%}), which "
                          f"moves latencies but not how many requests the engine admits or how often its cache "
                          f"hits, so the latency moves may be partly the host's ({reason})")
    broken = []
    for key, limit in after.meta.options.slo.items():
        m = METRIC_BY_NAME.get(key.removesuffix("_ms"))  # SLO keys: ttft_p99_ms or ttft_p99
        if m is None or limit is None:
            continue
        d = next((x for x in lv.metrics if x.metric == m.name), None)
        if d is not None and math.isfinite(d.b) and d.b > limit and not (math.isfinite(d.a) and d.a > limit):
            broken.append(f"{m.name} {d.b:.1f} {m.unit} > {limit:g} {m.unit}")
    gp = next((x for x in lv.metrics if x.metric == "goodput_rps"), None)
    if gp is not None and gp.verdict == "worse":
        broken.append(f"goodput_rps {gp.a:.3g} -> {gp.b:.3g} req/s ({gp.rel:+.0%}, {c.confidence:.0%} CI "
                      f"{gp.rel_lo:+.0%} to {gp.rel_hi:+.0%})")
    expected = {METRIC_BY_SIGNAL[s].name for s, _ in cause.experiment.expect if s in METRIC_BY_SIGNAL}
    elsewhere = [f"{d.metric} {d.rel:+.0%}" for d in lv.metrics if d.verdict == "worse" and d.metric not in expected]
    c.quality = quality(before.source, after.source, quality_cmd, quality_timeout_s, min_agreement, max_score_drop)
    refuted_by = ""
    failed, unmeasured = (c.quality["failed"], c.quality["unmeasured"]) if c.quality else ([], [])
    if failed:
        reason = "; ".join(failed) + f" (by the latencies alone: {outcome}: {reason})"
        outcome, refuted_by = "refuted", "quality"
    elif outcome == "confirmed" and broken:
        outcome, refuted_by = "refuted", "SLO"
        reason = f"the change breaks the SLO: {', '.join(broken)} ({reason})"
    elif outcome == "confirmed" and unmeasured:
        outcome, reason = "inconclusive", f"quality not measured: {'; '.join(unmeasured)} ({reason})"
    e = cause.experiment
    variable = describe(e.variable_kind, e.variable, e.value, before.engine) if e.variable else ""
    return Verification(fid, f.title, cause.cause, e.change + (f" (changes {variable})" if variable else ""),
                        lv.label, outcome, reason, moves, after_state, broken, elsewhere, c, refuted_by)



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
# set by the prompts and the cache, not by the host's speed: the same seeded workload hits a prefix cache as
# often on a fast host as on a slow one (experiment --top, stop 42: prefix caching alone came out
# inconclusive twice, TTFT -33% beside a concurrency-1 reference that moved -31%; with caching off before, its
# ratio counts as 0, ``_off_is_zero``)
HOST_FREE = ("prefix_cache_hit_ratio",)
RATIO_STEP = 0.05  # a hit ratio's move counts from 5 points (a count's from one request)


def _closed_at(a: Analysis, label: str) -> float | None:
    """The concurrency of the measured phase ``label`` when it is a closed loop, else None."""
    for p in a.phases:
        if not p.is_baseline and _label(p) == label:
            return p.concurrency if p.level_kind == "concurrency" and p.concurrency else None
    return None


def occupancy_moves(before: Analysis, after: Analysis, level: str, moves: Sequence[Move]) -> list[Move]:
    """The predicted moves the host's speed does not set (``host_confound``): the engine's occupancy (running,
    queued) when both runs held the same closed-loop concurrency at ``level``, and the prefix cache's hit ratio
    (``HOST_FREE``) at any load."""
    ca, cb = _closed_at(before, level), _closed_at(after, level)
    same_loop = ca is not None and ca == cb
    return [m for m in moves if (m.signal in HOST_FREE or (same_loop and m.signal in OCCUPANCY))
            and m.expect in ("up", "down") and math.isfinite(m.a) and math.isfinite(m.b)]


def occupancy_outcome(m: Move, noise: float) -> str:
    """"as expected", "opposite" or "no change" for such a point value: a change counts when it is at least
    one request (a hit ratio: ``RATIO_STEP``) and beyond the noise band (a cap holds a maximum exactly: 2 ->
    2)."""
    d = m.b - m.a
    step = RATIO_STEP if m.signal in HOST_FREE else 1.0
    if abs(d) < step or (m.a > 0 and abs(d) / m.a <= noise):
        return "no change"
    return "as expected" if (d > 0) == (m.expect == "up") else "opposite"


def _occupancy_text(occupancy: Sequence[Move]) -> str:
    return ", ".join(f"{m.signal} {m.a:.3g} -> {m.b:.3g} (expected {m.expect})" for m in occupancy)


def _occupancy_where(occupancy: Sequence[Move], label: str) -> str:
    """"in this closed loop at c=8 the engine's occupancy" or what else the moves are."""
    counts = any(m.signal in OCCUPANCY for m in occupancy)
    hits = any(m.signal in HOST_FREE for m in occupancy)
    what = ("the engine's occupancy and prefix-cache hit ratio" if counts and hits else
            "the engine's occupancy" if counts else "the prefix cache's hit ratio")
    return f"in this closed loop at {label} {what}" if counts else f"at {label} {what}"


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
