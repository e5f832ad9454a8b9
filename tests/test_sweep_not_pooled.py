"""A sweep is judged and reported level by level, never pooled (issue 32): the per-level rules are
phase-scoped, and the verdict's figures (CLI line, --json, "Where the time went") are those of the level the top
finding was judged on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.cli.analyze import analysis_json
from diagnose.pipeline import analyze_bundle
from diagnose.reports.view_model import build_view
from diagnose.rules.spec import load_rules

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


@pytest.fixture(scope="module")
def sweep():  # type: ignore[no-untyped-def]
    return analyze_bundle(SAMPLES / "vllm_cpu_queue_bound_sweep" / "bundle")


def test_the_top_finding_is_judged_on_one_level(sweep) -> None:  # type: ignore[no-untyped-def]
    top = next(f for f in sweep.findings if f.rule_id == sweep.verdict.top_rule)
    assert top.rule_id == "SCH001"
    windows = {e.window for e in top.evidence}
    assert windows == {"c=16"}, windows
    c16 = next(ps for p, ps in zip(sweep.phases, sweep.phase_signals, strict=True) if p.name == "c=16")
    shown = {e.signal: e.value for e in top.evidence}
    assert shown["queue_depth_mean"] == pytest.approx(c16["queue_depth_mean"].value)
    assert shown["queue_depth_mean"] != pytest.approx(sweep.signals["queue_depth_mean"].value)  # not the pool


def test_the_json_verdict_quotes_that_level_not_the_pool(sweep) -> None:  # type: ignore[no-untyped-def]
    line = analysis_json(sweep)["verdict"]
    assert "pooled" not in line and "at c=16: TTFT P50/P95/P99 " in line, line
    signals, level = sweep.verdict_window()
    assert level == "c=16" and f"{signals['ttft_p50_ms'].value:.0f}" in line


def test_where_the_time_went_is_that_levels(sweep) -> None:  # type: ignore[no-untyped-def]
    v = build_view(sweep)["verdict"]
    assert v["attribution_level"] == "c=16"
    signals, _ = sweep.verdict_window()
    inflight = next(r for r in v["attribution"] if r["label"] == "requests in flight")
    waiting = next(p for p in inflight["parts"] if p["signal"] == "queue_depth_mean")
    assert waiting["value"] == pytest.approx(signals["queue_depth_mean"].value)


def test_one_level_quotes_the_run() -> None:
    a = analyze_bundle(SAMPLES / "vllm_cpu_queue_bound" / "bundle")
    signals, level = a.verdict_window()
    assert level == "" and signals is a.signals
    assert build_view(a)["verdict"]["attribution_level"] == ""
    assert "at c=" not in json.dumps(analysis_json(a)["verdict"])


def test_per_level_rules_are_phase_scoped() -> None:
    scopes = {s.id: s.scope for s in load_rules(())}
    for rid in ("SCH001", "SCH003", "LAT001", "LAT002", "LAT004"):
        assert scopes[rid] == "phase", rid
    assert scopes["LAT003"] == "run"  # it compares the levels with each other


def test_the_json_document_states_its_schema_version(sweep) -> None:  # type: ignore[no-untyped-def]
    from diagnose.reports.document import JSON_SCHEMA_VERSION

    doc = analysis_json(sweep)
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == JSON_SCHEMA_VERSION == 1
