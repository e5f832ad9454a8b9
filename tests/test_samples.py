"""Every shipped sample bundle is analysed and its expected_findings.json checked.

expected_findings.json keys (all optional):
  top: rule id expected as the top finding (null: no finding at warning level or above)
  top3: rule ids of which at least one must be in the top three findings
  must_include: rule ids that must fire
  must_not_include: rule ids that must not fire
  must_not_include_severity_at_least: no finding this severe or worse (e.g. "warning" for healthy runs)
  evidence_checks: [{rule, signal, op, value}]: the finding's evidence shows the numbers that prove it
  explained_by: {rule: cause rule}: the finding is shown as explained by that cause (a symptom or consequence)
  run_valid: expected validity of the run
"""

from __future__ import annotations

import json
import operator
from html import escape
from pathlib import Path

import pytest

from diagnose.model import SEVERITY_WEIGHT
from diagnose.pipeline import analyze_bundle
from diagnose.reports.render import render_html

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
CASES = sorted(p.parent for p in SAMPLES.glob("*/expected_findings.json"))
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def test_there_are_samples() -> None:
    names = {p.name for p in CASES}
    assert {"vllm_cpu_healthy", "vllm_cpu_queue_bound"} <= names, names


@pytest.mark.parametrize("sample", CASES, ids=[p.name for p in CASES])
def test_sample(sample: Path) -> None:
    exp = json.loads((sample / "expected_findings.json").read_text())
    bundle = sample / "bundle" if (sample / "bundle" / "manifest.json").exists() else sample
    a = analyze_bundle(bundle)
    ids = [f.rule_id for f in a.findings]
    serious = [f for f in a.findings if f.severity != "info" and not f.held_back]  # held back: not asserted
    if "top" in exp:
        if exp["top"] is None:
            assert not [f for f in serious if SEVERITY_WEIGHT[f.severity] >= SEVERITY_WEIGHT["warning"]], ids
        else:
            assert serious and serious[0].rule_id == exp["top"], f"top finding {ids[:3]}, expected {exp['top']}"
    # a closed world: every sample names its exact top cause and exactly its findings at warning or above
    assert "top" in exp and "warning_and_above" in exp, f"{sample}/expected_findings.json is not a closed world"
    alarm = sorted({f.rule_id for f in serious if SEVERITY_WEIGHT[f.severity] >= SEVERITY_WEIGHT["warning"]})
    assert alarm == sorted(exp["warning_and_above"]), f"findings at warning+ {alarm}, expected {exp['warning_and_above']}"
    if exp.get("top3"):
        assert set(ids[:3]) & set(exp["top3"]), f"top 3 {ids[:3]} has none of {exp['top3']}"
    for rid in exp.get("must_include", []):
        assert rid in ids, f"{rid} did not fire: {ids}"
    for rid in exp.get("must_not_include", []):
        assert rid not in ids, f"{rid} fired: {ids}"
    sev = exp.get("must_not_include_severity_at_least")
    if sev:
        bad = [f.rule_id for f in a.findings if SEVERITY_WEIGHT[f.severity] >= SEVERITY_WEIGHT[sev]]
        assert not bad, f"findings at {sev} or above on {sample.name}: {bad}"
    for chk in exp.get("evidence_checks", []):
        f = next(f for f in a.findings if f.rule_id == chk["rule"])
        ev = {e.signal: e.value for e in f.evidence}
        assert chk["signal"] in ev, f"{chk['rule']} shows no {chk['signal']}"
        assert OPS[chk["op"]](ev[chk["signal"]], chk["value"]), f"{chk['signal']}={ev[chk['signal']]}"
    by = {f.rule_id: f.explained_by for f in a.findings}
    for rid, cause in exp.get("explained_by", {}).items():
        assert by.get(rid) == cause, f"{rid} explained by {by.get(rid)!r}, expected {cause}"
    if "run_valid" in exp:
        assert a.run_valid is exp["run_valid"]
    html = render_html(a)
    assert len(html) < 2_000_000
    assert a.verdict is not None and escape(a.verdict.headline) in html
