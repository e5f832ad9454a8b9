"""The CI gate of `diagnose compare --fail-on-regression` (docs/compare.md, "The CI gate").

Each metric of the gate, at each matched load level, gets one of three outcomes:

* **regressed**: B is worse than A by more than the allowance, and that is established: the bootstrap
  interval of the difference excludes zero on the worse side; or, for a percentile with too few requests for
  an interval (``compare._too_few``), every value of B lies beyond every value of A by more than the
  allowance and so complete a separation has a probability under 1 - confidence were A and B one distribution
  (1 / C(n_a + n_b, n_a), the exact Mann-Whitney test at its extreme);
* **passed**: B's change is within the allowance (then no interval could make it a regression: the gate
  compares the point change with the allowance), or beyond it but not significant on an interval that could
  be computed;
* **undecided**: the gate cannot judge: the change is beyond the allowance but the metric has too few
  requests for an interval (and the samples overlap), the metric cannot be computed on one side (no SLO for
  goodput, no price for cost, no request), or no load level is common to both runs. `compare` exits with
  its own status (exits.UNDECIDED) unless ``--allow-undecided``: a gate that could not look is no pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from diagnose.compare.core import Comparison, MetricDiff
from diagnose.compare.records import GateRow
from diagnose.compare.samples import METRIC_BY_NAME, LevelSample, MetricDef
from diagnose.errors import InputError

Gate = list[tuple[MetricDef, float]]


def _usage(part: str, why: str) -> InputError:
    return InputError(f"--fail-on-regression {part!r}: {why}")


def parse_gate(spec: str) -> Gate:
    """``ttft_p99=5%,output_tps=-3%`` -> [(metric, +0.05), (metric, -0.03)]: the change that counts as a
    regression, signed as the regression's direction (up for latency and cost, down for throughput). A
    malformed spec (empty, an empty item, a duplicate metric, no ``%``, the wrong sign) is a one-line error."""
    if not spec.strip():
        raise InputError("--fail-on-regression '': no METRIC=PCT% given (e.g. ttft_p99=5%,output_tps=-3%)")
    out: Gate = []
    seen: set[str] = set()
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise InputError(f"--fail-on-regression {spec!r}: an empty item (a stray or trailing comma)")
        name, sep, val = part.partition("=")
        name = name.strip()
        if not sep or name not in METRIC_BY_NAME:
            raise _usage(part, "use METRIC=PCT% with METRIC one of " + ", ".join(METRIC_BY_NAME))
        if name in seen:
            raise _usage(part, f"{name} is given twice")
        seen.add(name)
        v = val.strip()
        if not v.endswith("%"):
            raise _usage(part, f"{v!r} is not a percentage: write it with %, e.g. {name}=5%")
        try:
            pct = float(v[:-1]) / 100.0
        except ValueError:
            raise _usage(part, f"{v!r} is not a percentage") from None
        if not math.isfinite(pct):
            raise _usage(part, f"{v!r} is not a finite percentage")
        m = METRIC_BY_NAME[name]
        if m.better == "lower" and pct < 0:
            raise _usage(part, f"{name} regresses when it rises: the allowance is a rise, >= 0% (e.g. {name}=5%)")
        if m.better == "higher" and pct > 0:
            raise _usage(part, f"{name} regresses when it drops: the allowance is a drop, <= 0% (e.g. {name}=-3%)")
        if m.better == "higher" and pct <= -1.0:
            raise _usage(part, f"{name} cannot drop by 100% or more")
        out.append((m, pct))
    return out


def _values(s: LevelSample, m: MetricDef) -> tuple[np.ndarray, int] | None:
    """A percentile metric's values, and how many requests they come from (gaps of one request are not
    independent: the separation test counts requests); None for other metrics."""
    base, _, pct = m.name.rpartition("_")
    if base == "itl":
        ok = np.isfinite(s.itl)
        return s.itl[ok], len(np.unique(s.itl_req[ok]))
    if base in ("ttft", "tpot", "e2e") and base in s.values:
        v = s.values[base]
        v = v[np.isfinite(v)]
        return v, len(v)
    return None


def separated(sa: LevelSample, sb: LevelSample, m: MetricDef, limit: float, confidence: float) -> bool:
    """Every value of B beyond every value of A, in the worse direction, by more than ``limit``; and that
    separation significant at ``confidence`` (module docstring)."""
    va, vb = _values(sa, m), _values(sb, m)
    if va is None or vb is None or not len(va[0]) or not len(vb[0]):
        return False
    (xa, na), (xb, nb) = va, vb
    # log of the chance of complete separation of na + nb exchangeable values in this direction
    log_p = math.lgamma(na + 1) + math.lgamma(nb + 1) - math.lgamma(na + nb + 1)
    if not log_p < math.log(1.0 - confidence):
        return False
    if m.better == "lower":
        top_a, low_b = float(xa.max()), float(xb.min())
        return top_a > 0 and low_b > top_a * (1.0 + limit)
    low_a, top_b = float(xa.min()), float(xb.max())
    return low_a > 0 and top_b < low_a * (1.0 + limit)


def _outcome(d: MetricDiff, m: MetricDef, limit: float, pair: tuple[LevelSample, LevelSample] | None,
             confidence: float) -> tuple[str, str]:
    """(outcome, why) of one metric at one level."""
    worse_dir = "up" if m.better == "lower" else "down"
    if not (math.isfinite(d.a) and math.isfinite(d.b)):
        return "undecided", f"{m.name} cannot be computed on {'A' if not math.isfinite(d.a) else 'B'}"
    no_worse = d.b <= d.a if m.better == "lower" else d.b >= d.a
    if no_worse:
        return "passed", "not worse"
    if not math.isfinite(d.rel):
        return "undecided", f"{m.name} is 0 on A: no relative change"
    if not (d.rel > limit if m.better == "lower" else d.rel < limit):
        return "passed", "within the allowance"
    if d.verdict == "too few requests":
        if pair is not None and separated(pair[0], pair[1], m, limit, confidence):
            return "regressed", ("too few requests for an interval, but every request of B is worse than every "
                                 "request of A by more than allowed")
        return "undecided", "beyond the allowance, but too few requests for an interval"
    if d.significant == worse_dir:
        return "regressed", "significantly worse, beyond the allowance"
    if not (math.isfinite(d.diff_lo) and math.isfinite(d.diff_hi)):
        return "undecided", "beyond the allowance, but no interval could be computed"
    return "passed", "beyond the allowance, but not significant"


def apply_gate(c: Comparison, gate: Sequence[tuple[MetricDef, float]]) -> list[GateRow]:
    """One row per gate metric and matched level (``regressed`` as before; ``outcome``: regressed / passed /
    undecided, with ``why``); one undecided row per metric when no level is matched."""
    rows: list[GateRow] = []
    for lv in c.levels:
        by = {m.metric: m for m in lv.metrics}
        pair = c.samples.get(lv.label)
        for m, limit in gate:
            d = by.get(m.name)
            if d is None:
                why = "no --cost-per-hour or recorded prices" if m.name.startswith("cost_") else "not measured"
                outcome = ("undecided", f"{m.name}: {why}")
                rel, verdict = None, "not comparable"
            else:
                outcome = _outcome(d, m, limit, pair, c.confidence)
                rel, verdict = (d.rel if math.isfinite(d.rel) else None), d.verdict
            rows.append({"level": lv.label, "metric": m.name, "allowed": limit, "rel": rel, "verdict": verdict,
                         "regressed": outcome[0] == "regressed", "outcome": outcome[0], "why": outcome[1]})
    if not c.levels:
        why = ("no load level is common to both runs" if c.comparability.get("problems") or not c.trace
               else "two traces: no request metrics to judge")
        rows = [{"level": None, "metric": m.name, "allowed": limit, "rel": None, "verdict": "not comparable",
                 "regressed": False, "outcome": "undecided", "why": why} for m, limit in gate]
    c.gate = rows
    return rows


def undecided(c: Comparison) -> list[GateRow]:
    return [g for g in c.gate if g.get("outcome") == "undecided"]
