"""The `analyze --json` document: a projection of the report's view model (:func:`view_model.build_view`), so
that the HTML page and the JSON say the same thing. The verdict, its cause and experiment, the headline numbers
(the page's tiles, per level on a sweep), the ranking of the findings and which finding folds into which card
all come from the one view; the JSON adds what a machine reads and a page does not print whole (every signal of
the run and of each phase, the probes' records, the kernel trace's step table).

The document starts with ``schema_version``: raised when a key is removed, renamed or changes meaning (new keys
do not raise it); a consumer checks it before reading (README, "analyse").
"""

from __future__ import annotations

import json
from typing import Any

from diagnose.analysis import Analysis

from .view_model import build_view
from .view_types import View

JSON_SCHEMA_VERSION = 1


def verdict_line(a: Analysis) -> str:
    """The verdict as the CLI prints it and the JSON states it: the judgement stage's headline, plus the headline
    numbers of the window it was judged on when judged ("at c=16: ..." on a sweep, never the levels pooled)."""
    from diagnose.rules.verdict import key_numbers

    if a.verdict is None:
        return ""
    signals, level = a.verdict_window()
    nums = key_numbers(signals, f"at {level}: " if level else "") if a.verdict.judged else ""
    return a.verdict.headline + (f" ({nums})" if nums else "")


def build_document(a: Analysis, view: View | None = None) -> dict[str, Any]:
    """The JSON document of ``a``, from ``view`` (the page's view model; built when not given)."""
    view = view if view is not None else build_view(a)
    v = view["verdict"]
    folded = {f["rule_id"]: card["rule_id"] for card in view["findings"] for f in card["also_seen"]}
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "source": a.source,
        "verdict": verdict_line(a),
        "verdict_level": a.verdict.level if a.verdict else None,
        # the page's headline tiles: the same signals, labels and window (per level on a sweep)
        "key_numbers": [{k: n[k] for k in ("signal", "label", "value", "unit", "window")} for n in v["key_numbers"]],
        "key_numbers_by_level": [{"level": lv["label"], "key_numbers": [
            {k: n[k] for k in ("signal", "label", "value", "unit")} for n in lv["key_numbers"]]}
            for lv in v.get("by_level") or []],
        "diagnosis": None if a.verdict is None or not a.verdict.cause else {
            "top_rule": a.verdict.top_rule, "cause": a.verdict.cause, "cause_status": a.verdict.cause_status,
            "cause_evidence": a.verdict.cause_evidence, "share": a.verdict.share, "share_of": a.verdict.share_of,
            "refute": a.verdict.refute, "experiment": a.verdict.experiment, "explains": list(a.verdict.explains),
            "symptom": a.verdict.symptom},
        "run_valid": a.run_valid,
        "partial": a.partial,
        # ranked as the page's cards; a finding the page shows inside another's card names it
        "findings": [{**f.to_json(), "folded_into": folded.get(f.rule_id)} for f in a.findings],
        "not_evaluated": [n.to_json() for n in a.not_evaluated],
        "signals": {k: {"value": s.value, "unit": s.unit, "source": s.source} for k, s in sorted(a.signals.items())},
        "phases": [
            {"phase": p.phase, "name": p.name, "role": p.role,
             "signals": {k: s.value for k, s in sorted(ps.items())}}
            for p, ps in zip(a.phases, a.phase_signals, strict=False)
        ],
        "probes": [s.to_json() for s in a.probe_statuses],
        **({"probe_cost": a.probe_cost} if a.probe_cost is not None else {}),  # docs/probe-cost.md
        "warnings": list(a.warnings),
        **_trace_json(a),
        **({"workload_card": a.workload_card} if a.workload_card is not None else {}),  # docs/workload.md
    }


def _trace_json(a: Analysis) -> dict[str, Any]:
    """Kernel traces: the per-step table, its percentiles and the graph mode (docs/trace-analysis.md)."""
    tables = a.tables
    keys = (("steps", "trace_steps"), ("step_percentiles", "trace_step_percentiles"), ("graph_mode", "trace_graph_mode"))
    out = {k: json.loads(tables[t].to_json(orient="records")) for k, t in keys
           if t in tables and not tables[t].empty}
    return {"trace": out} if out else {}
