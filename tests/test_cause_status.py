"""Cause statuses on every shipped sample: ordered, and never contradicted by the finding's own evidence.

A finding lists its candidate causes supported first, open next, ruled out last. A cause marked "supported"
must not have its refuting condition (``refuted_when``) met by the evidence the same finding shows, and its
confirming condition (``supported_when``) must hold on those numbers wherever they are shown; a "ruled out"
cause's refuting condition must hold likewise. The status_evidence text names values that are the finding's
own evidence values when both show the same signal.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Analysis
from diagnose.engines.experiments import spell_text
from diagnose.model import Finding, Signal
from diagnose.pipeline import analyze_bundle
from diagnose.rules.conditions import Evaluator
from diagnose.rules.engine import render_text
from diagnose.rules.spec import RuleSpec, load_rules, load_thresholds

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
SAMPLE_DIRS = sorted(p.parent for p in SAMPLES.glob("*/expected_findings.json"))
SPECS: dict[str, RuleSpec] = {s.id: s for s in load_rules()}
THRESHOLDS = load_thresholds()
ORDER = {"supported": 0, "open": 1, "ruled out": 2}


@functools.cache
def _analysis(sample: Path) -> Analysis:
    bundle = sample / "bundle" if (sample / "bundle" / "manifest.json").exists() else sample
    return analyze_bundle(bundle)


def _evidence_signals(f: Finding) -> dict[str, Signal]:
    return {e.signal: Signal(e.signal, e.value, e.unit, "derived") for e in f.evidence}


def _raw_cause(spec: RuleSpec, text: str, signals: Mapping[str, Signal], engine: str | None) -> Mapping[str, Any]:
    for c in spec.causes:  # as the pipeline shows it: in the engine's words (diagnose.engines.experiments.spell_text)
        if spell_text(render_text(str(c["cause"]), signals, THRESHOLDS), engine) == text:
            return c
    raise AssertionError(f"{spec.id}: no cause renders as {text!r}")


def test_there_are_samples_with_findings() -> None:
    assert len(SAMPLE_DIRS) >= 10
    assert sum(1 for s in SAMPLE_DIRS if _analysis(s).findings) >= 9


@pytest.mark.parametrize("sample", SAMPLE_DIRS, ids=[p.name for p in SAMPLE_DIRS])
def test_ruled_out_causes_come_last(sample: Path) -> None:
    for f in _analysis(sample).findings:
        ranks = [ORDER[c.status] for c in f.causes]
        assert ranks == sorted(ranks), f"{sample.name} {f.rule_id}: causes out of order {[c.status for c in f.causes]}"


@pytest.mark.parametrize("sample", SAMPLE_DIRS, ids=[p.name for p in SAMPLE_DIRS])
def test_statuses_agree_with_the_findings_own_evidence(sample: Path) -> None:
    a = _analysis(sample)
    for f in a.findings:
        spec = SPECS[f.rule_id]
        shown = _evidence_signals(f)
        for c in f.causes:
            raw = _raw_cause(spec, c.cause, a.signals, a.engine)
            refuted = Evaluator(shown, THRESHOLDS).evaluate(raw["refuted_when"]) if "refuted_when" in raw else None
            supported = (Evaluator(shown, THRESHOLDS).evaluate(raw["supported_when"])
                         if "supported_when" in raw else None)
            where = f"{sample.name} {f.rule_id} {c.cause!r}"
            if c.status == "supported":
                assert refuted is not True, f"{where}: supported, but the finding's evidence refutes it"
                assert supported is not False, f"{where}: supported, but the finding's evidence does not confirm it"
            elif c.status == "ruled out":
                assert "refuted_when" in raw, f"{where}: ruled out without a refuting condition"
                assert refuted is not False, f"{where}: ruled out, but the finding's evidence does not refute it"
            else:
                assert c.status == "open", where
                assert c.status_evidence == "", where
            if c.status != "open":
                assert c.status_evidence, f"{where}: {c.status} without the values that decided it"
                for part in c.status_evidence.split(", "):
                    name = part.split(" = ")[0].split(" (--")[0]  # 'max_num_seqs (--parallel)' on llama.cpp
                    assert name in a.signals or any(name in p for p in a.phase_signals), f"{where}: {name}"
                    if name in shown and spec.scope != "phase":
                        assert shown[name].value == a.signals[name].value, f"{where}: {name} differs"


def test_some_sample_decides_causes_both_ways() -> None:
    """The conditions are exercised on real bundles: at least one supported and one ruled-out top-finding cause."""
    seen = {c.status for s in SAMPLE_DIRS for f in _analysis(s).findings[:1] for c in f.causes}
    assert {"supported", "ruled out"} <= seen, seen
