"""The judgement of a sweep's levels, made once, before the view: the knee of the throughput curve (where the
server saturates) and the highest level that meets the SLO (max goodput). The pipeline computes both
(:func:`sweep_marks`, ``Analysis.sweep``); the report's throughput-latency curve marks them, and the SLO-edge
search (diagnose/runs/goodput.py) judges its levels with the same two functions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diagnose.model import Phase, Signal, level_phases

SATURATION_SHARE = 0.95  # a level within 5% of the best output tok/s is saturated
CURVE_METRICS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")  # the latency lines of a throughput-latency curve


@dataclass(frozen=True)
class SweepMarks:
    """A sweep's judged levels, by their names ("c=16"): ``knee`` None when saturation was not reached (its
    ``knee_note`` says why); ``max_goodput`` None without an SLO, on an invalid run, or when no level met it."""

    knee: str | None
    knee_note: str
    max_goodput: str | None


def knee(labels: Sequence[str], tps: Sequence[float]) -> tuple[int | None, str]:
    """The knee of a throughput curve (levels in load order): the index of the lowest level within 5% of the
    best output tok/s, and a note; None when not reached (the top level still grew more than 5% over the one
    below it) or when fewer than two levels have a throughput."""
    pts = [(i, lab, v) for i, (lab, v) in enumerate(zip(labels, tps, strict=True)) if math.isfinite(v)]
    if len(pts) < 2:
        return None, "one level measured: no curve" if pts else "no throughput measured"
    best = max(v for _, _, v in pts)
    i, lab, v = next(p for p in pts if p[2] >= SATURATION_SHARE * best)
    (_, lab_below, below), (i_top, lab_top, top) = pts[-2], pts[-1]
    if i == i_top and top > below / SATURATION_SHARE:
        return None, (f"not reached: output tok/s still grew {top / below - 1:.0%} from {lab_below} to {lab_top}; "
                      f"saturation at least {top:.4g} tok/s")
    return i, f"{lab}: {v:.4g} tok/s, within {1 - SATURATION_SHARE:.0%} of the best ({best:.4g} tok/s)"


def meets(values: Mapping[str, float | None], slo: Mapping[str, float]) -> bool | None:
    """Whether point values ('ttft_p99_ms' -> ms) meet every SLO term; None when a term has no value."""
    out = True
    for key, limit in slo.items():
        v = values.get(key)
        if v is None or not math.isfinite(v):
            return None
        out = out and v <= limit
    return out


def sweep_levels(phases: Sequence[Phase], phase_signals: Sequence[Mapping[str, Signal]]
                 ) -> list[tuple[Phase, Mapping[str, Signal]]]:
    """Each measured level once (a repeated level by its first run, as the sweep rules see it), in load order,
    with its signals."""
    sig = {p.phase: s for p, s in zip(phases, phase_signals, strict=False)}
    return [(p, sig.get(p.phase, {})) for p in sorted(level_phases(phases), key=lambda p: (p.level or 0.0, p.phase))]


def _value(signals: Mapping[str, Signal], name: str) -> float | None:
    s = signals.get(name)
    return s.value if s is not None and s.is_finite() else None


def sweep_marks(phases: Sequence[Phase], phase_signals: Sequence[Mapping[str, Signal]], slo: Mapping[str, float],
                run_valid: bool) -> SweepMarks | None:
    """The knee and the max-goodput level of a sweep (None for fewer than two levels)."""
    levels = sweep_levels(phases, phase_signals)
    if len(levels) < 2:
        return None
    tps = [_value(s, "output_tps") for _, s in levels]
    i, note = knee([p.level_name for p, _ in levels], [math.nan if v is None else v for v in tps])
    best = None
    if slo and run_valid:
        best = next((p.level_name for p, s in reversed(levels) if meets({k: _value(s, k) for k in slo}, slo)), None)
    return SweepMarks(knee=None if i is None else levels[i][0].level_name, knee_note=note, max_goodput=best)
