"""Issue 32 item 2: one view feeds the HTML page and `analyze --json`. The JSON document is a projection of the
page's view model (reports/document.py), built once by the CLI for both: the same verdict, the same headline
numbers (per level on a sweep), the same ranking and the same folding of a finding into another's card."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import orjson
import pytest

from diagnose.analysis import Analysis
from diagnose.pipeline import analyze as analyze_path
from diagnose.reports import view_model
from diagnose.reports.document import build_document
from tests.badinput import analyze as analyze_cli

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
# a single level with a folded card (SCH003 into SCH001), a sweep, a kernel trace, llama.cpp


@cache
def analyze(path: Path) -> Analysis:  # each sample analysed once for this file's tests (the Analysis is frozen)
    return analyze_path(path)


CASES = ("vllm_cpu_queue_bound", "vllm_cpu_queue_bound_sweep", "h200_toy_idle_between_steps", "llama_slots_saturated")


@pytest.mark.parametrize("sample", CASES)
def test_the_json_is_the_pages_view(sample: str) -> None:
    a = analyze(SAMPLES / sample)
    view = view_model.build_view(a)
    doc = build_document(a, view)
    v = view["verdict"]
    assert a.verdict is not None and doc["verdict"].startswith(v["headline"])
    assert [(n["signal"], n["value"], n["window"]) for n in doc["key_numbers"]] == \
        [(n["signal"], n["value"], n["window"]) for n in v["key_numbers"]]
    assert [lv["level"] for lv in doc["key_numbers_by_level"]] == [lv["label"] for lv in v["by_level"]]
    # the page's cards are the JSON's findings that fold into no other, in the same order
    cards = [c["rule_id"] for c in view["findings"]]
    judged = {f.rule_id for f in a.findings if a.run_valid or f.family == "validity"}
    assert [f["rule_id"] for f in doc["findings"] if f["folded_into"] is None and f["rule_id"] in judged] == cards
    for card in view["findings"]:
        for seen in card["also_seen"]:
            assert next(f for f in doc["findings"] if f["rule_id"] == seen["rule_id"])["folded_into"] == card["rule_id"]


def test_the_queue_bound_sample_folds_sch003_into_sch001_in_both() -> None:
    doc = build_document(analyze(SAMPLES / "vllm_cpu_queue_bound"))
    assert {f["rule_id"]: f["folded_into"] for f in doc["findings"]}["SCH003"] == "SCH001"


def test_a_sweep_json_states_each_levels_numbers_and_no_pooled_tiles() -> None:
    doc = build_document(analyze(SAMPLES / "vllm_cpu_queue_bound_sweep"))
    assert doc["key_numbers"] == [] and len(doc["key_numbers_by_level"]) >= 3


def test_the_cli_builds_one_view_for_the_page_and_the_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = view_model.build_view

    def counted(*args: object, **kw: object) -> dict[str, object]:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(view_model, "build_view", counted)
    res = analyze_cli([SAMPLES / "vllm_cpu_queue_bound"], tmp_path)
    assert res.exit_code == 0, res.output
    assert len(calls) == 1
    doc = orjson.loads((tmp_path / "findings.json").read_bytes())
    html = (tmp_path / "report.html").read_text()
    assert doc["key_numbers"] and all(n["label"] in html for n in doc["key_numbers"])


def test_the_curve_marks_the_levels_the_pipeline_judged() -> None:
    """The knee and the max-goodput level are judged once, by the pipeline (Analysis.sweep): the view marks
    whatever it was given and judges nothing itself."""
    import dataclasses

    from diagnose.signals.sweep import SweepMarks

    a = analyze(SAMPLES / "vllm_cpu_queue_bound_sweep")
    assert a.sweep is not None and a.sweep.knee is not None
    names = {s["name"] for s in view_model.build_view(a)["charts"]["curve"]["series"]}
    assert f"knee (saturation): {a.sweep.knee}" in names
    other = next(p.level_name for p in a.phases if p.level_name != a.sweep.knee and not p.is_baseline)
    moved = dataclasses.replace(a, sweep=SweepMarks(knee=other, knee_note="", max_goodput=None))
    names = {s["name"] for s in view_model.build_view(moved)["charts"]["curve"]["series"]}
    assert f"knee (saturation): {other}" in names and f"knee (saturation): {a.sweep.knee}" not in names
