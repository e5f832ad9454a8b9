"""How findings rank (rules/engine.py, docs/rules.md "Ranking"): a cause is scored by the share of the symptom
it explains (its rule's ``share:`` signal, measured in the bundle; the impact estimate only where none is known)
and by how well its evidence fits (confidence x the fit of its best candidate cause: supported, open, or every
one ruled out)."""

from __future__ import annotations

from typing import Any

from diagnose.model import Signal
from diagnose.rules.engine import FIT_ALL_RULED_OUT, FIT_OPEN, FIT_SUPPORTED, evaluate
from diagnose.rules.spec import parse_spec


def _rule(rid: str, *, share: str | None = None, impact_over: float = 1.0, cause_when: dict[str, Any] | None = None,
          refute_when: dict[str, Any] | None = None) -> Any:
    cause: dict[str, Any] = {"cause": f"cause of {rid}", "confirm": "x", "refute": "y"}
    if cause_when:
        cause["supported_when"] = cause_when
    if refute_when:
        cause["refuted_when"] = refute_when
    raw: dict[str, Any] = {
        "id": rid, "name": rid.lower(), "family": "scheduler", "severity": "warning",
        "when": {"signal": f"{rid.lower()}_x", "op": ">", "value": 0},
        "title": rid, "hypothesis": rid, "causes": [cause], "confidence": 0.7,
        "impact": {"signal": f"{rid.lower()}_x", "over": impact_over},
    }
    if share:
        raw["share"] = [share]
    return parse_spec(raw, f"{rid}.yaml")


def _sig(values: dict[str, float]) -> dict[str, Signal]:
    return {n: Signal(n, v, "ratio", "server") for n, v in values.items()}


def test_the_cause_that_explains_more_of_the_symptom_ranks_first() -> None:
    """A is far past its own reference (impact 0.9) but explains 10% of TTFT; B is barely past its reference
    and explains 85%. Scored by impact (the old ranking), A led; scored by the share it explains, B leads."""
    a = _rule("A", share="a_share_ratio")
    b = _rule("B", share="b_share_ratio")
    sigs = _sig({"a_x": 10.0, "b_x": 1.25, "a_share_ratio": 0.10, "b_share_ratio": 0.85})
    res = evaluate([a, b], sigs, {})
    assert [f.rule_id for f in res.findings] == ["B", "A"]
    fb, fa = res.findings
    assert fa.impact > fb.impact  # what the old score ranked by
    assert fb.share == 0.85 and fb.share_of == "b_share_ratio"


def test_without_a_measured_share_the_impact_estimate_stands_in() -> None:
    a, b = _rule("A", share="a_share_ratio"), _rule("B")
    res = evaluate([a, b], _sig({"a_x": 10.0, "b_x": 10.0}), {})
    assert res.findings[0].score == res.findings[1].score  # no share known for A: both by impact, same
    assert res.findings[0].share is None


def test_fit_follows_the_best_candidate_cause() -> None:
    """Same rule, same numbers: a supported cause fits better than an open one, and a finding whose every
    candidate cause its own evidence rules out fits worst."""
    sup = _rule("S", cause_when={"signal": "s_x", "op": ">", "value": 0})
    opn = _rule("O")
    out = _rule("R", refute_when={"signal": "r_x", "op": ">", "value": 0})
    res = evaluate([sup, opn, out], _sig({"s_x": 2.0, "o_x": 2.0, "r_x": 2.0}), {})
    by = {f.rule_id: f for f in res.findings}
    assert [f.rule_id for f in res.findings] == ["S", "O", "R"]
    assert by["S"].fit == round(0.7 * FIT_SUPPORTED, 3)
    assert by["O"].fit == round(0.7 * FIT_OPEN, 3)
    assert by["R"].fit == round(0.7 * FIT_ALL_RULED_OUT, 3)
    assert by["S"].score / by["R"].score == FIT_SUPPORTED / FIT_ALL_RULED_OUT


def test_a_finding_that_invalidates_the_run_leads_whatever_the_scores() -> None:
    """A critical validity finding (the client was the bottleneck) makes the run invalid: it leads the list the
    verdict, the report and the scenario suite read, even when a cause that explains much of the symptom
    scores higher (the tuning split's frontend-bound run: LAT008 1.42 against VAL001 1.41)."""
    cause = _rule("B", share="b_share_ratio")
    raw = dict(_rule("V").raw, id="V", family="validity", severity="critical")
    valid = parse_spec(raw, "V.yaml")
    res = evaluate([cause, valid], _sig({"b_x": 9.0, "b_share_ratio": 0.9, "v_x": 1.1}), {})
    assert res.findings[0].score < res.findings[1].score
    assert [f.rule_id for f in res.findings] == ["V", "B"]
