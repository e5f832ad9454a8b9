"""The report's view model: the plain data the HTML displays (verdict, findings, percentiles, charts)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagnose.analysis import Analysis
from diagnose.model import Finding, Signal, Window
from diagnose.reports.demo import demo_sections, synthetic_analysis
from diagnose.reports.sections.model import FlameGraph, LineChart, LineSeries, Section, Table
from diagnose.reports.view_model import build_view
from diagnose.requests import mark_run


@pytest.fixture(scope="module")
def demo() -> Analysis:
    return synthetic_analysis(per_level_s=8.0)


def test_view_is_plain_json(demo: Analysis) -> None:
    view = build_view(demo)
    text = json.dumps(view, allow_nan=False)  # raises on NaN/inf or non-JSON types
    assert json.loads(text)["schema"] == 1


def test_findings_ranked_by_score_with_experiments(demo: Analysis) -> None:
    view = build_view(demo)
    scores = [f["score"] for f in view["findings"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 2
    top = view["findings"][0]
    assert top["rule_id"] == "LAT001"
    exp = top["causes"][0]["experiment"]
    assert exp["change"].startswith("raise --max-num-seqs")
    assert exp["expect"][0] == {"signal": "server_queue_time_p50_ms", "direction": "down", "arrow": "↓"}
    assert top["evidence"][0]["signal"] == "ttft_p99_ms" and top["evidence"][0]["unit"] == "ms"
    assert [n["rule_id"] for n in view["not_evaluated"]] == ["GPU001", "OTL001"]
    assert view["not_evaluated"][1]["missing"] == ["ttft_queue_share_ratio", "join_matched_ratio"]


def test_verdict_leads_with_top_finding_and_key_numbers_per_level(demo: Analysis) -> None:
    v = build_view(demo)["verdict"]
    assert v["level"] == "warning"
    assert v["headline"] == demo.verdict.headline and v["headline"].startswith("Most likely: TTFT P99")
    # a sweep: the headline numbers are per level, never pooled over the levels
    assert v["key_numbers"] == []
    assert [lv["label"] for lv in v["by_level"]] == ["c=1", "c=4", "c=16"]
    for lv, sigs in zip(v["by_level"], demo.phase_signals, strict=True):
        labels = {k["label"] for k in lv["key_numbers"]}
        assert {"TTFT P50", "TTFT P99", "ITL P50", "ITL P99", "output", "requests"} <= labels
        ttft = next(k for k in lv["key_numbers"] if k["signal"] == "ttft_p99_ms")
        assert ttft["value"] == pytest.approx(sigs["ttft_p99_ms"].value) and ttft["window"] == lv["label"]


def test_invalid_run_verdict_comes_from_the_judgement_and_nothing_else_is_judged() -> None:
    from diagnose.rules.verdict import decide

    a = synthetic_analysis(per_level_s=3.0)
    bad = Finding("VAL001", "client-bound", "validity", "critical", "Run invalid: the load client was the bottleneck "
                  "(loop lag P99 40.0 ms)", "The client's event loop lagged 40 ms.", 0.9, 1.0, 4.0)
    a.signals["goodput_ratio"] = Signal("goodput_ratio", 0.0731, "ratio", "client")
    findings = [*a.findings, bad]
    a = dataclasses.replace(a, findings=findings, verdict=decide(findings, a.signals))
    view = build_view(a)
    v = view["verdict"]
    assert v["level"] == "invalid" and v["headline"] == a.verdict.headline
    assert v["headline"].startswith("Run invalid: the load client was the bottleneck")
    assert "TTFT P99" not in v["headline"]  # not the top server finding
    # no goodput / within-SLO tile, and the server findings are listed as not judged, not as results
    assert all(k["signal"] not in ("goodput_ratio", "goodput_rps") for lv in v["by_level"] for k in lv["key_numbers"])
    assert [f["rule_id"] for f in view["findings"]] == ["VAL001"]
    assert {f["rule_id"] for f in view["not_judged"]} == {"LAT001", "SCL002"}
    for w in view["percentiles"]["windows"]:
        assert all(t["signal"] not in ("goodput_ratio", "goodput_rps") for t in w["throughput"])
    assert any("Invalid run" in b["text"] for b in view["banners"])


def test_partial_capture_banner_first() -> None:
    a = synthetic_analysis(per_level_s=3.0, partial=True)
    banners = build_view(a)["banners"]
    assert banners[0]["level"] == "error" and banners[0]["text"].startswith("Partial capture: SIGINT")


def test_percentiles_match_signals_and_sweep(demo: Analysis) -> None:
    p = build_view(demo)["percentiles"]
    run = p["windows"][2]  # c=16: a sweep has one table per level and none pooled
    ttft = next(r for r in run["rows"] if r["key"] == "ttft")
    assert ttft["values"]["p99"] == pytest.approx(demo.phase_signals[2]["ttft_p99_ms"].value)
    assert ttft["values"]["p50"] <= ttft["values"]["p90"] <= ttft["values"]["p95"] <= ttft["values"]["p99"]
    tpot = next(r for r in run["rows"] if r["key"] == "tpot")
    assert tpot["values"]["max"] is None  # no such signal: shown as missing, never as 0
    thr = {t["signal"]: t["value"] for t in run["throughput"]}
    assert thr["output_tps"] == pytest.approx(demo.phase_signals[2]["output_tps"].value)
    assert "request_rps" in thr
    assert [w["label"] for w in p["windows"]] == ["c=1", "c=4", "c=16"]
    assert [r["label"] for r in p["sweep"]["rows"]] == ["c=1", "c=4", "c=16"]
    assert p["sweep"]["groups"][0] == {"label": "TTFT (ms)", "span": 2}
    ttft_p50 = [r["cells"][0]["value"] for r in p["sweep"]["rows"]]
    assert ttft_p50 == sorted(ttft_p50)  # latency grows with load in the synthetic sweep
    assert p["slos"] == [{"signal": "slo_ttft_p99_ms", "value": 200.0, "unit": "ms"}]


def test_percentiles_are_never_recomputed_from_the_requests_table() -> None:
    req = pd.DataFrame({"rid": [0, 1, 2, 3], "phase": 0, "warmup": [True, False, False, False],
                        "ok": [True, True, True, False], "ttft_ms": [1000.0, 10.0, 20.0, 5000.0],
                        "e2e_ms": [2000.0, 100.0, 200.0, 6000.0], "tpot_ms": [1.0, 2.0, 3.0, 4.0],
                        "sent_s": [0.0, 1.0, 2.0, 3.0], "end_s": [2.0, 1.1, 2.2, 9.0]})
    itl = pd.DataFrame({"rid": [0, 1, 1, 2], "t_s": [0.1, 1.0, 1.1, 2.1], "itl_ms": [999.0, 1.0, 3.0, 5.0]})
    tables = {"requests": req, "itl": itl}
    mark_run(tables, Window(-np.inf, np.inf))  # the pipeline marks the requests that count; the view filters
    view = build_view(Analysis(source="x", manifest={}, tables=tables))
    run = view["percentiles"]["windows"][0]
    # the statistics come from the signals only (one definition, diagnose.requests): none here, so none shown
    assert all(v is None for r in run["rows"] for v in r["values"].values())
    assert run["note"].startswith("not available")
    assert view["charts"]["ttft"]["n"] == 2  # the chart shows the same counted requests (no warm-up, no failed)


def test_empty_analysis_marks_everything_not_available() -> None:
    view = build_view(Analysis(source="empty", manifest={}))
    for key in ("ttft", "itl", "timeline"):
        assert view["charts"][key]["kind"] == "unavailable"
        assert view["charts"][key]["reason"]
    assert view["percentiles"]["windows"][0]["note"].startswith("not available")
    assert view["verdict"]["level"] == "ok" and view["findings"] == []


def test_distributions_and_timeline(demo: Analysis) -> None:
    charts = build_view(demo)["charts"]
    # the demo is a sweep (c=1, 4, 16): one CDF per level, no pooled histogram (issue 32); the histograms'
    # binning is checked on one level of the same synthetic run
    assert charts["ttft"] is None and charts["itl"] is None and len(charts["itl_by_phase"]["series"]) == 3
    one = synthetic_analysis(levels=(16,))
    ttft = build_view(one)["charts"]["ttft"]
    measured = one.tables["requests"]
    measured = measured[~measured["warmup"] & measured["ok"]]
    assert ttft["kind"] == "histogram" and ttft["n"] == len(measured)
    assert sum(b[2] for b in ttft["bins"]) == len(measured)
    assert ttft["markers"][2]["label"] == "P99"
    itl = build_view(one)["charts"]["itl"]
    assert itl["kind"] == "histogram" and itl["log_x"] is ("log scale" in itl["x_label"])
    from diagnose.reports.sections_view import bin_values

    rng = np.random.default_rng(0)  # gaps spanning decades (rare stalls) are binned on a log scale
    assert bin_values(np.concatenate([rng.uniform(3, 8, 5000), rng.uniform(300, 900, 300)]))["log_x"] is True
    tl = charts["timeline"]
    names = [s["name"] for s in tl["series"]]
    assert "requests in flight (client)" in names and "server queue depth" in names
    assert [b["label"] for b in tl["bands"]] == ["c=1", "c=4", "c=16"]
    inflight = next(s for s in tl["series"] if s["name"].startswith("requests in flight"))
    assert max(y for _, y in inflight["points"]) == 16  # concurrency 16 reached in the last phase
    assert all(len(s["points"]) <= 600 for s in tl["series"])


def test_timeline_without_metrics_says_why() -> None:
    a = synthetic_analysis(per_level_s=2.0, levels=(2,))
    del a.tables["metrics"]
    tl = build_view(a)["charts"]["timeline"]
    assert "server queue depth not available" in tl["note"]
    assert tl["bands"] == []  # one phase: no bands


def test_errors_summary_counts_categories(demo: Analysis) -> None:
    errs = build_view(demo)["errors"]
    n_bad = int((~demo.tables["requests"]["ok"]).sum())
    assert errs["total"] == n_bad > 0
    assert errs["rows"][0]["category"] == "http_5xx" and errs["rows"][0]["example"] == "upstream reset"


def test_environment_redacts_secrets(demo: Analysis) -> None:
    env = build_view(demo)["environment"]
    flat = {f"{g['group']}:{k}": v for g in env for k, v in g["rows"]}
    assert flat["Target:headers"] == "[redacted]"
    assert "sk-" not in json.dumps(env) and "Bearer" not in json.dumps(env)
    assert flat["Workload:note"] == "[redacted] passed by mistake"
    assert flat["Workload:output_tokens"] == "64"  # *_tokens counts are not mistaken for secrets
    assert flat["Target:model"] == "tiny-llama"


def test_sections_grouped_in_fixed_order(demo: Analysis) -> None:
    groups = build_view(demo, demo_sections())["section_groups"]
    assert [g["group"] for g in groups] == ["latency", "server", "host", "trace"]
    kinds = {s["kind"] for g in groups for s in g["sections"]}
    assert kinds == {"stacked_bars", "waterfall", "line_chart", "table", "flamegraph", "histogram", "text"}


def test_malformed_sections_are_refused_when_made() -> None:
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        Table(("a", "b"), ((1,),))
    with pytest.raises(TypeError, match="needs its unit"):
        Table(("a",), ((1.5,),))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"points must be \(x, y\) pairs"):
        LineChart((LineSeries("s", "nope"),))  # type: ignore[arg-type]


def test_unknown_and_unreadable_sections_become_unavailable() -> None:
    class Sankey:
        kind = "sankey"

    a = Analysis(source="x", manifest={})
    secs = {s["id"]: s for g in build_view(a, [
        Section("b", "Odd", Sankey()),  # type: ignore[arg-type]
        Section("c", "Bad flame", FlameGraph({"name": "r", "value": 1.0, "children": "nope"})),
    ])["section_groups"] for s in g["sections"]}
    assert secs["b"]["kind"] == "unavailable" and "sankey" in secs["b"]["reason"]
    assert secs["c"]["kind"] == "unavailable" and "malformed" in secs["c"]["reason"]


def test_nan_signal_values_are_missing_not_zero() -> None:
    sig = {"ttft_p50_ms": Signal("ttft_p50_ms", float("nan"), "ms", "client")}
    f = Finding("X1", "x", "latency", "info", "t", "h", float("nan"), 0.0, 1.0)
    view = build_view(Analysis(source="x", manifest={}, signals=sig, findings=[f]))
    row = view["percentiles"]["windows"][0]["rows"][0]
    assert row["values"]["p50"] is None
    assert view["findings"][0]["confidence"] is None
    json.dumps(view, allow_nan=False)


def test_large_series_are_bounded() -> None:
    rng = np.random.default_rng(1)
    n = 50_000
    pts = np.column_stack([np.arange(n) / 10, rng.random(n)])
    pts[12345, 1] = 99.0  # a spike that must survive downsampling
    a = Analysis(source="x", manifest={})
    sec = build_view(a, [Section("l", "Long", LineChart((LineSeries("s", tuple((x, y) for x, y in pts.tolist())),),
                                                        x_label="t (s)", y_label="v"))])["section_groups"][0]["sections"][0]
    assert len(sec["series"][0]["points"]) <= 400
    assert max(y for _, y in sec["series"][0]["points"]) == 99.0


def test_baseline_phase_is_outside_the_run_figures() -> None:
    a = synthetic_analysis(levels=(1, 4), per_level_s=3.0)
    a.phases[0] = dataclasses.replace(a.phases[0], role="baseline")
    a = dataclasses.replace(a, run_window=Window(a.phases[0].start_s, a.phases[1].end_s, None, "run", (0,)),
                            signals=dict(a.phase_signals[1]))  # the window's time covers the baseline too
    assert a.run_window is not None
    mark_run(a.tables, a.run_window)  # as the pipeline does for its run window
    view = build_view(a)
    req = a.tables["requests"]
    in_run = req[(req["phase"] == 1) & ~req["warmup"] & req["ok"]]
    assert view["charts"]["ttft"]["n"] == len(in_run)
    labels = [w["label"] for w in view["percentiles"]["windows"]]
    assert labels == ["c=4", "c=1 (reference)"]  # the one measured level, then the baseline as a labelled reference


def test_observe_only_timeline_shows_queue_depth() -> None:
    metrics = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "signal": "queue_depth", "value": [0.0, 3.0, 1.0]})
    tl = build_view(Analysis(source="b", manifest={}, tables={"metrics": metrics}))["charts"]["timeline"]
    assert tl["kind"] == "line_chart" and tl["series"][0]["points"] == [[1.0, 0.0], [2.0, 3.0], [3.0, 1.0]]
    assert "in-flight count and TTFT not available" in tl["note"]


def test_trace_analysis_title_and_environment() -> None:
    a = Analysis(source="/data/rank0.pt.trace.json.gz",
                 manifest={"schema_version": None, "kind": "trace", "trace": {"events": 1200, "gpu": False}})
    view = build_view(a)
    assert view["title"] == "Profiler trace: rank0.pt.trace.json.gz"
    assert view["environment"] == [{"group": "Trace", "rows": [["events", "1200"], ["gpu", "False"]]}]


def test_malformed_tables_make_charts_unavailable_not_crash() -> None:
    req = pd.DataFrame({"rid": [1, 2], "sent_s": ["soon", "later"], "end_s": [1.0, 2.0], "ttft_ms": ["x", "y"],
                        "ok": [True, True], "warmup": [False, False]})
    view = build_view(Analysis(source="x", manifest={}, tables={"requests": req, "itl": pd.DataFrame({"x": [1]})}))
    assert view["charts"]["ttft"] == {"kind": "unavailable", "title": "TTFT distribution",
                                      "reason": "no successful measured requests to plot"}  # text -> NaN, left out
    assert view["charts"]["timeline"]["kind"] == "unavailable"
    assert view["charts"]["itl"]["reason"].startswith("no itl table")
    assert view["percentiles"]["windows"][0]["note"].startswith("not available")


def test_guard_turns_a_table_error_into_a_reason() -> None:
    from diagnose.reports.view_model import _guard

    spec = _guard("T", lambda: {"a": 1}["missing"])
    assert spec["kind"] == "unavailable" and spec["reason"] == "the input table is malformed (KeyError: 'missing')"


def test_key_like_text_in_error_details_and_probe_reasons_is_redacted() -> None:
    from diagnose.model import ProbeStatus

    req = pd.DataFrame({"rid": [1], "ok": [False], "error": ["http_4xx"], "warmup": [False],
                        "error_detail": ["401: invalid api_key=sk-live-abcdefgh12345 for Bearer tok123"]})
    view = build_view(Analysis(source="x", manifest={}, tables={"requests": req},
                               probe_statuses=[ProbeStatus("otel", "failed", "export failed: Bearer abc.def")],
                               warnings=["token: hf_abcdefghijkl leaked"]))
    text = json.dumps(view)
    assert "sk-live" not in text and "abc.def" not in text and "hf_abcdefghijkl" not in text and "tok123" not in text
    assert view["errors"]["rows"][0]["example"].startswith("401: invalid [redacted]")


def test_ttft_cdf_per_load_level(demo: Analysis) -> None:
    cdf = build_view(demo)["charts"]["ttft_by_phase"]
    assert [s["name"].split(" ")[0] for s in cdf["series"]] == ["c=1", "c=4", "c=16"]
    medians = [s["points"][50][0] for s in cdf["series"]]
    assert medians == sorted(medians)  # the distribution moves right as load grows
    assert all(len(s["points"]) == 101 and s["points"][100][1] == 100 for s in cdf["series"])
    single = synthetic_analysis(levels=(2,), per_level_s=2.0)
    assert build_view(single)["charts"]["ttft_by_phase"] is None


def test_workload_card_counts_the_requests_the_tables_count() -> None:
    """One request filter everywhere (issue 32): the kv-pressure sample's card counted 52 requests (warm-up
    included, its own filter) where every table and requests_measured count 48."""
    from diagnose.pipeline import analyze_bundle
    from diagnose.signals.workload_card import workload_card

    a = analyze_bundle(Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_kv_pressure" / "bundle")
    card = workload_card(a)
    assert card is not None
    assert card["requests"] == a.signals["requests_measured"].value == 48
    assert card["requests_sent"] == 52
    rows = {r["label"]: r["value"] for r in build_view(a)["workload_card"]}
    assert rows["Requests"].startswith("48 measured (52 sent"), rows["Requests"]


def test_a_sweep_report_pools_no_distribution() -> None:
    """Issue 32: the sweep sample said 'no figure pools the levels' above TTFT and ITL histograms of all levels
    together; a sweep now shows one CDF per level for each, and no pooled histogram."""
    from diagnose.pipeline import analyze_bundle

    a = analyze_bundle(Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_queue_bound_sweep"
                       / "bundle")
    charts = build_view(a)["charts"]
    assert charts["ttft"] is None and charts["itl"] is None
    for key in ("ttft_by_phase", "itl_by_phase"):
        names = [s["name"].split(" (n=")[0] for s in charts[key]["series"]]
        assert names == [p.name for p in a.phases], (key, names)
        assert all(len(s["points"]) == 101 for s in charts[key]["series"])
    one = analyze_bundle(Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_healthy" / "bundle")
    one_charts = build_view(one)["charts"]
    assert one_charts["itl"]["kind"] == "histogram" and one_charts["itl_by_phase"] is None
