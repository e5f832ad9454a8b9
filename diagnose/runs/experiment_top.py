"""``diagnose experiment --top N``: one shared baseline, the experiments of the top N findings run one at a time
(one engine flag changed each), each verified against the baseline with intervals, then all of them together;
a what-if table of the effect of each and of the combination (docs/compare.md, "experiment --top").

Optimisations interact: two flags that each cut TTFT by 40% need not cut it by 64% together, and one may undo
the other. So the combined change is measured, not multiplied out. Findings whose experiment names the same
flag as a higher-ranked one are skipped (one variable per experiment); experiments diagnose cannot run (not an
engine flag, no value) are listed with why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.runs.experiment import Plan, apply_flag, plan

if TYPE_CHECKING:
    from diagnose.compare.verify import Verification

#: the what-if table's columns: the metric and its label
WHAT_IF = (("ttft_p50", "TTFT P50"), ("ttft_p99", "TTFT P99"), ("itl_p50", "ITL P50"), ("output_tps", "output tok/s"),
           ("goodput_rps", "goodput"))


def top_plans(before_dir: Path, argv: Sequence[str], n: int) -> tuple[list[Plan], list[str]]:
    """The experiments of BEFORE's top ``n`` runnable findings, in rank order, one flag each (a finding whose
    flag an earlier one already changes is skipped), and why the others were not run."""
    from diagnose.pipeline import analyze

    a = analyze(before_dir)
    plans: list[Plan] = []
    skipped: list[str] = []
    order = [a.verdict.top_rule] if a.verdict and a.verdict.top_rule else []
    order += [f.rule_id for f in a.findings if not f.held_back and f.rule_id not in order]
    for fid in order:
        if len(plans) >= n:
            break
        p, why = plan(before_dir, argv, fid)
        if p is None:
            skipped.append(why)
            if why.startswith("the first run is invalid"):
                break
            continue
        same = next((q for q in plans if q.flag.split(" ")[0] == p.flag.split(" ")[0]), None)
        if same is not None:
            skipped.append(f"{p.finding}: its experiment changes {p.flag.split(' ')[0]}, as {same.finding}'s "
                           "does: one variable per experiment")
            continue
        plans.append(p)
    return plans, skipped


def combined_argv(argv: Sequence[str], plans: Sequence[Plan]) -> list[str]:
    """The server command with every plan's flag changed."""
    out = list(argv)
    for p in plans:
        out = apply_flag(out, p.flag, p.value)
    return out


@dataclass
class WhatIf:
    name: str  # "SCH001: --max-num-seqs 16" or "combined"
    verification: Verification

    def row(self) -> dict[str, Any]:
        v = self.verification
        cells: dict[str, Any] = {}
        for key, _ in WHAT_IF:
            try:
                d = v.comparison.metric(key, v.level)
            except KeyError:
                continue
            cells[key] = {"a": _num(d.a), "b": _num(d.b), "rel": _num(d.rel), "rel_lo": _num(d.rel_lo),
                          "rel_hi": _num(d.rel_hi), "verdict": d.verdict}
        return {"experiment": self.name, "finding": v.finding, "outcome": v.outcome, "refuted_by": v.refuted_by,
                "reason": v.reason, "level": v.level, "metrics": cells}


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def what_if_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table as text: per experiment, its outcome and each metric's change with its interval."""
    out = ["what-if (each change alone against the shared baseline, then all together):"]
    for r in rows:
        outcome = r["outcome"] + (f": {r['refuted_by']}" if r.get("refuted_by") else "")
        cells = []
        for key, label in WHAT_IF:
            c = r["metrics"].get(key)
            if c is None or c["rel"] is None:
                continue
            iv = f" [{c['rel_lo']:+.0%}, {c['rel_hi']:+.0%}]" if c["rel_lo"] is not None and c["rel_hi"] is not None \
                else ""
            cells.append(f"{label} {c['rel']:+.0%}{iv}")
        out.append(f"  {r['experiment']:<36} {outcome:<18} at {r['level']}: " + "; ".join(cells))
    return out
