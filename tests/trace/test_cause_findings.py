"""Issue 11 items 5 and 6: trace findings in the serving rules' shape (symptom -> attribution -> cause with
supporting and refuting evidence -> experiment), each saying over how many steps and events it holds."""

from __future__ import annotations

import pytest

from diagnose.rules.engine import evaluate
from diagnose.rules.lint import template_fields
from diagnose.rules.spec import RuleSpec, load_rules, load_thresholds
from diagnose.trace import analyze_trace
from tests.trace.helpers import DATA

TRACE_RULES = [r for r in load_rules() if r.family == "trace"]


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.id)
def test_every_cause_is_judged_by_evidence_and_has_a_one_variable_experiment(rule: RuleSpec) -> None:
    for c in rule.causes:
        assert c.get("supported_when") or c.get("refuted_when"), f"{rule.id}: {c['cause']} has no evidence test"
        var = (c.get("experiment") or {}).get("variable")
        assert isinstance(var, dict) and var.get("kind") and var.get("name"), f"{rule.id}: {c['cause']}"


@pytest.mark.parametrize("rule", TRACE_RULES, ids=lambda r: r.id)
def test_every_title_says_over_how_many_steps_or_events(rule: RuleSpec) -> None:
    assert any(f.endswith("_count") for f in template_fields([rule.title])), rule.title


@pytest.mark.parametrize("rid", ["TRC001", "TRC002", "TRC004"])
def test_gpu_idle_findings_read_symptom_attribution_cause(rid: str) -> None:
    h = next(r for r in TRACE_RULES if r.id == rid).hypothesis
    assert 0 <= h.index("Symptom:") < h.index("Attribution:") < h.index("Cause:")


def test_causes_judged_on_a_real_eager_trace() -> None:
    """TraceLens's B200 eager trace: no graph replay at all, 2 pageable async copies, no sync while the GPU
    idled inside its step."""
    a = analyze_trace(DATA / "b200_8rank_nccl_eager.json.gz")
    sig = {s.name: s for s in a.signals}
    res = evaluate(TRACE_RULES, sig, load_thresholds())
    f = {x.rule_id: x for x in res.findings}
    eager = next(c for c in f["TRC001"].causes if "runs eagerly" in c.cause)
    assert eager.status == "supported" and "trace_graph_kernel_ratio = 0" in eager.status_evidence
    assert f["TRC001"].causes[0] is eager  # supported first
    assert f["TRC001"].share == pytest.approx(sig["trace_gpu_idle_launch_explained_ratio"].value, abs=1e-4)
    assert f["TRC002"].share == pytest.approx(sig["trace_gpu_idle_host_wait_ratio"].value, abs=1e-4) and f["TRC002"].share > 0.9
    status = {c.cause.split(" (")[0]: c.status for c in f["TRC004"].causes}
    assert status["host buffers in pageable memory"] == "supported"
    assert [s for k, s in status.items() if k.startswith("a device-to-host copy")] == ["ruled out"]
    assert f["TRC002"].hypothesis.startswith("Symptom: the GPU is idle 86% of the traced window")
