"""Regression tests for the contradictions the pipeline issue quoted from real reports: findings never contradict
the evidence beside them, and nothing judged on an invalid run is presented as a result."""

from __future__ import annotations

from pathlib import Path

from diagnose.pipeline import analyze
from diagnose.reports.render import render_html
from diagnose.reports.view_model import build_view

SAMPLES = Path(__file__).parent.parent / "sample_traces"


def test_the_engines_cap_is_read_from_the_bundle_and_the_kv_cause_is_ruled_out() -> None:
    a = analyze(SAMPLES / "vllm_cpu_queue_bound")
    assert a.signals["max_num_seqs"].value == 2  # from the engine's command line, recorded at capture
    top = a.findings[0]
    assert top.rule_id == "SCH001"
    assert {e.signal: e.value for e in top.evidence}["max_num_seqs"] == 2
    kv = next(c for c in top.causes if c.cause.startswith("KV-cache capacity"))
    assert kv.status == "ruled out" and "kv_usage_max_ratio" in kv.status_evidence
    assert top.causes[-1] is kv  # ruled-out causes come last, never first as a suggestion
    html = render_html(a)
    assert "cap n/a" not in html and "cap unknown" not in html
    assert "Ruled out:</b> KV-cache capacity limits admission" in html
    assert " 0% full" not in html


def test_a_missing_setting_says_unknown_not_na() -> None:
    from diagnose.model import Signal
    from diagnose.rules.engine import evaluate
    from diagnose.rules.spec import load_rules, load_thresholds

    spec = [s for s in load_rules() if s.id == "SCH003"]
    sig = {n: Signal(n, v, "", "server") for n, v in {"queue_depth_mean": 12.0, "running_requests_mean": 2.0,
                                                        "running_requests_max": 2.0, "kv_usage_max_ratio": 0.0005}.items()}
    f = evaluate(spec, sig, load_thresholds()).findings[0]
    assert "(cap unknown)" in f.title and "n/a" not in f.title
    assert "0.05% full" in f.hypothesis


def test_nothing_judged_on_an_invalid_run_is_shown_as_a_result() -> None:
    # HST005 used to fire here on EngineCore's yield loop (issue 10, failure class 6); the engine's working
    # threads wait 38%, under the 50% gate: a lower gate makes it fire, so that it must be held back
    assert "HST005" not in {f.rule_id for f in analyze(SAMPLES / "vllm_cpu_client_bound").findings}
    a = analyze(SAMPLES / "vllm_cpu_client_bound", threshold_overrides={"host_contention_max": 0.3})
    assert not a.run_valid and a.verdict is not None and a.verdict.level == "invalid"
    view = build_view(a)
    assert view["verdict"]["headline"].startswith("Run invalid: the load client was the bottleneck")
    assert [f["rule_id"] for f in view["findings"]] == ["VAL001"]
    assert "HST005" in {f["rule_id"] for f in view["not_judged"]}  # shown, but as not judged
    tiles = view["verdict"]["key_numbers"] + [k for lv in view["verdict"]["by_level"] for k in lv["key_numbers"]]
    assert all(k["signal"] not in ("goodput_ratio", "goodput_rps") for k in tiles)
    html = render_html(a)
    verdict = html[html.index('id="verdict"'): html.index('id="findings"')]
    assert "within SLO" not in verdict
    assert "not judged: run invalid" in html


def test_server_ttft_p50_has_one_value_on_the_page() -> None:
    # regression: the queue-bound report showed server TTFT P50 as 1,459, 1,417 and 1,388 ms in three places
    # (the cross-check used a window that took in the baseline)
    a = analyze(SAMPLES / "vllm_cpu_queue_bound")
    view = build_view(a)
    xc = next(s for g in view["section_groups"] for s in g["sections"] if s["id"] == "ttft_crosscheck")
    p50 = next(r for r in xc["rows"] if r[0]["parts"][1]["value"] == 50.0)
    assert p50[2]["value"] == a.signals["server_ttft_p50_ms"].value
    assert "rank ceil(q·n)" in xc["columns"][1]  # the client column's own definition, labelled
    hist = next(s for g in view["section_groups"] for s in g["sections"] if s["id"] == "server_histograms")
    assert "whole capture" in hist["title"]  # a different window, and it says so


def test_the_headline_never_calls_high_a_latency_the_symptom_calls_normal() -> None:
    """Issue 32: the host-bound sample's headline cited 'TTFT P99 86 ms' as high latency and the symptom line
    under it called the same 86 ms normal. On every sample, a latency the symptom calls normal is not quoted in
    the headline."""
    import re

    for sample in sorted(p.parent for p in SAMPLES.glob("*/expected_findings.json")):
        v = analyze(sample).verdict
        assert v is not None
        for metric, value in re.findall(r"normal (TTFT|ITL) \(P99 ([\d.]+) ms\)", v.symptom):
            assert f"{metric} P99 {value}" not in v.headline, (sample.name, v.headline, v.symptom)


def test_no_experiment_asks_for_host_stacks_the_bundle_already_has() -> None:
    """Issue 32: the host-bound sample, captured with py-spy, was told to 'profile with py-spy (--pyspy)'. On every
    sample with py-spy stacks, the verdict's experiment and no cause's experiment is a --pyspy capture."""
    for sample in sorted(p.parent for p in SAMPLES.glob("*/expected_findings.json")):
        a = analyze(sample)
        if not any(p.name == "pyspy" and p.state == "ok" for p in a.probe_statuses):
            continue
        assert a.verdict is not None and "--pyspy" not in a.verdict.experiment, (sample.name, a.verdict.experiment)
        for f in a.findings:
            for c in f.causes:
                if c.experiment is not None:
                    assert "--pyspy" not in c.experiment.variable, (sample.name, f.rule_id, c.experiment.variable)
