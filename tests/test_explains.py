"""Consequences linked to their cause (a cause rule's ``explains:``), and the verdict that names the cause, the
share of the symptom it explains, what would refute it and the one experiment (issue 10, failure class 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnose.model import Signal
from diagnose.pipeline import analyze
from diagnose.reports.render import render_html
from diagnose.rules.engine import evaluate
from diagnose.rules.lint import lint
from diagnose.rules.spec import CATALOG_DIR, load_rules, load_thresholds
from diagnose.rules.verdict import decide

SAMPLES = Path(__file__).parent.parent / "sample_traces"


def _sig(values: dict[str, float]) -> dict[str, Signal]:
    return {n: Signal(n, v, "", "server") for n, v in values.items()}


# KV-cache preemption (the real kv_pressure run's numbers) with the queueing it causes: both rules fire
KV_PREEMPTION = {
    "preemptions_total": 120.0, "requests_measured": 200.0, "kv_usage_max_ratio": 1.0, "kv_usage_mean_ratio": 0.93,
    "queue_depth_mean": 12.0, "queue_depth_max": 20.0, "running_requests_mean": 9.0, "running_requests_max": 12.0,
    "max_num_seqs": 256.0, "server_queue_share_of_ttft_ratio": 0.9, "server_queue_time_p50_ms": 4000.0,
    "server_ttft_p50_ms": 4400.0, "output_tokens_mean": 512.0, "itl_p99_ms": 60.0, "ttft_p99_ms": 9000.0,
    "e2e_p99_ms": 40000.0,
}


def test_queueing_caused_by_preemption_is_its_consequence_and_loses_its_advice() -> None:
    specs = [s for s in load_rules() if s.id in ("SCH001", "SCH005")]
    res = evaluate(specs, _sig(KV_PREEMPTION), load_thresholds())
    ids = [f.rule_id for f in res.findings]
    assert ids == ["SCH005", "SCH001"], ids  # the consequence ranks after its cause whatever its score
    queue = res.findings[1]
    assert queue.explained_by == "SCH005"
    # "raise --max-num-seqs" would admit more requests into a full KV cache: more preemption
    assert all(c.experiment is None for c in queue.causes)
    assert res.findings[0].explained_by == "" and any(c.experiment for c in res.findings[0].causes)
    v = decide(res.findings, _sig(KV_PREEMPTION))
    assert v.top_rule == "SCH005" and v.explains == ("SCH001",)


def test_without_the_cause_the_consequence_keeps_its_own_advice() -> None:
    specs = [s for s in load_rules() if s.id == "SCH001"]
    res = evaluate(specs, _sig(KV_PREEMPTION), load_thresholds())
    assert [f.rule_id for f in res.findings] == ["SCH001"]
    assert res.findings[0].explained_by == "" and any(c.experiment for c in res.findings[0].causes)


def test_the_verdict_names_cause_share_refutation_and_experiment() -> None:
    a = analyze(SAMPLES / "vllm_cpu_queue_bound")
    v = a.verdict
    assert v is not None and v.top_rule == "SCH001"
    assert v.cause.startswith("the batch-size cap") and v.cause_status == "supported"
    assert "max_num_seqs" in v.cause_evidence
    assert v.share is not None and 0.5 < v.share <= 1.0  # queue time's share of server TTFT
    assert v.share_of in ("ttft_queue_share_ratio", "server_ttft_split_queue_ratio", "server_queue_share_of_ttft_ratio")
    assert v.refute and v.experiment.startswith("raise --max-num-seqs") and "ttft_p50_ms down" in v.experiment
    html = render_html(a)
    assert "The experiment to run" in html and "Would refute it" in html
    from markupsafe import escape

    from diagnose.signals.catalog import SIGNALS
    assert f"({escape(SIGNALS[v.share_of])})" in html  # the share says what it is a share of (as the page escapes it)
    lat = next(f for f in a.findings if f.rule_id == "LAT001")
    assert lat.explained_by == "SCH001"
    assert "Consequence of SCH001" in html


def test_a_verdict_never_offers_a_ruled_out_cause() -> None:
    specs = [s for s in load_rules() if s.id == "SCH001"]
    sig = _sig({"queue_depth_mean": 12.0, "server_queue_share_of_ttft_ratio": 0.9, "running_requests_mean": 0.5,
                "max_num_seqs": 256.0, "kv_usage_max_ratio": 0.01})
    res = evaluate(specs, sig, load_thresholds())
    v = decide(res.findings, sig)
    statuses = {c.cause: c.status for c in res.findings[0].causes}
    assert statuses[v.cause] != "ruled out"
    assert v.cause == "offered load above capacity (no cap helps)"  # cap and KV both ruled out: the open one


def test_lint_rejects_an_explains_link_to_no_rule(tmp_path: Path) -> None:
    src = (CATALOG_DIR / "scheduler" / "SCH007.yaml").read_text()
    (tmp_path / "USR901.yaml").write_text(
        src.replace("id: SCH007", "id: USR901").replace("explains: [LAT002]", "explains: [LAT999]"))
    (tmp_path / "cases").mkdir()
    problems = lint([tmp_path], [tmp_path / "cases", Path(__file__).parent / "rules" / "cases"])
    assert any("explains names LAT999, which is no rule" in p for p in problems), problems


@pytest.mark.parametrize("bad", ["explains: LAT001", "explains: [lat001]"])
def test_explains_must_be_a_list_of_rule_ids(tmp_path: Path, bad: str) -> None:
    src = (CATALOG_DIR / "scheduler" / "SCH007.yaml").read_text()
    (tmp_path / "USR902.yaml").write_text(src.replace("id: SCH007", "id: USR902").replace("explains: [LAT002]", bad))
    problems = lint([tmp_path], [tmp_path / "cases"])
    assert any("explains must be a list of rule ids" in p for p in problems), problems


def test_a_client_near_its_limit_holds_back_findings_that_rest_on_client_timings_alone() -> None:
    """Failure class 7: loop lag P99 9 ms under the 10 ms gate against a 14 ms ITL. The saturation symptom
    (its condition reads only client-derived ratios) is held back; the queue finding, read from the server's
    own histograms, stands and stays the verdict."""
    specs = [s for s in load_rules() if s.id in ("VAL006", "LAT003", "SCH001")]
    sig = {n: Signal(n, v, "", src) for n, v, src in (
        ("client_loop_lag_p99_ms", 9.0, "client"), ("itl_p50_ms", 14.0, "client"), ("ttft_p50_ms", 900.0, "client"),
        ("load_vs_baseline_ratio", 16.0, "derived"), ("ttft_vs_baseline_ratio", 12.0, "derived"),
        ("itl_vs_baseline_ratio", 2.5, "derived"), ("tps_vs_baseline_ratio", 2.0, "derived"),
        ("queue_depth_mean", 8.0, "server"), ("server_queue_share_of_ttft_ratio", 0.8, "server"))}
    res = evaluate(specs, sig, load_thresholds())
    by = {f.rule_id: f for f in res.findings}
    assert set(by) == {"VAL006", "LAT003", "SCH001"}
    assert by["LAT003"].held_back == "VAL006" and by["SCH001"].held_back == ""
    assert res.findings[-1].rule_id == "LAT003"
    assert decide(res.findings, sig).top_rule == "SCH001"
    # without the client's lag nothing is held back
    sig["client_loop_lag_p99_ms"] = Signal("client_loop_lag_p99_ms", 1.0, "ms", "client")
    assert not any(f.held_back for f in evaluate(specs, sig, load_thresholds()).findings)


def test_the_verdict_shows_where_the_time_went_with_shares_that_add_up() -> None:
    from diagnose.reports.view_model import build_view

    a = analyze(SAMPLES / "vllm_cpu_prefill_heavy")
    rows = {r["label"]: r["parts"] for r in build_view(a)["verdict"]["attribution"]}
    ttft = rows["TTFT, server histograms"]
    assert [p["label"] for p in ttft] == ["queue", "prefill", "API server + network + client"]
    assert sum(p["value"] for p in ttft) == pytest.approx(1.0)
    flight = {p["label"]: p["value"] for p in rows["requests in flight"]}
    assert flight["engine waiting"] == pytest.approx(a.signals["queue_depth_mean"].value)
    # the median token: 1536-token prompts chunked into nearly every step make the engine's share dominate
    itl = {p["label"]: p["value"] for p in rows["ITL P50"]}
    assert list(itl) == ["a decode step alone", "engine under load (batch, prefill, preemption)",
                         "API server + network + client"]
    assert sum(itl.values()) == pytest.approx(1.0)
    assert itl["engine under load (batch, prefill, preemption)"] > 0.9
    assert "anywhere in its bucket [200, 300] ms" in a.signals["itl_split_engine_load_ratio"].description
    assert "Where the time went" in render_html(a)


def test_the_itl_split_adds_up_against_a_decode_step() -> None:
    from diagnose.normalize.derived import itl_split

    def sig(**kw: float) -> dict[str, Signal]:
        return {k: Signal(k, v, "ms", "t") for k, v in kw.items()}

    s = itl_split(sig(itl_p50_ms=22.0, server_itl_p50_ms=20.0), sig(baseline_itl_p50_ms=5.0))
    assert {k: v.value for k, v in s.items()} == pytest.approx(
        {"itl_split_decode_ratio": 5 / 22, "itl_split_engine_load_ratio": 15 / 22, "itl_split_outside_ratio": 2 / 22})
    # the server's interpolated P50 above the client's: nothing outside, shares of the server's
    s = itl_split(sig(itl_p50_ms=4.0, server_itl_p50_ms=5.0), sig(baseline_itl_p50_ms=4.5))
    assert s["itl_split_outside_ratio"].value == 0.0
    assert sum(x.value for x in s.values()) == pytest.approx(1.0)
    assert itl_split(sig(itl_p50_ms=4.0), sig(baseline_itl_p50_ms=4.5)) == {}  # no server histogram: no split


def test_decode_stalls_from_recomputed_prefixes_are_the_prefix_misses_consequence() -> None:
    a = analyze(SAMPLES / "vllm_cpu_prefix_cache_miss")
    by = {f.rule_id: f for f in a.findings}
    assert a.verdict is not None and a.verdict.top_rule == "SCH006"
    assert by["SCH007"].explained_by == "SCH006"


def test_the_verdict_never_quotes_a_held_back_symptom() -> None:
    """The sweep sample: its client's lag holds back LAT001 (VAL006), so LAT001 is no symptom in the verdict."""
    a = analyze(SAMPLES / "vllm_cpu_queue_bound_sweep")
    lat = next(f for f in a.findings if f.rule_id == "LAT001")
    assert lat.held_back == "VAL006"
    assert a.verdict is not None and a.verdict.top_rule == "SCH001" and lat.title != a.verdict.symptom


def test_a_serving_symptom_leads_and_the_kernel_traces_idle_stands_beside_it() -> None:
    """h200 idle-between-steps: TRC002 (host wait) explains the trace symptom TRC010 (GPU idle); the verdict's
    symptom is the user's (latency under load) first, then the kernel trace's."""
    a = analyze(SAMPLES / "h200_toy_idle_between_steps")
    by = {f.rule_id: f for f in a.findings}
    assert a.verdict is not None and a.verdict.top_rule == "TRC002"
    assert by["TRC010"].explained_by == "TRC002" and by["TRC010"].kind == "symptom"
    head, _, trace = a.verdict.symptom.partition("; in the kernel trace: ")
    assert trace == by["TRC010"].title
    assert head in {f.title for f in a.findings if f.kind == "symptom" and f.family != "trace"}


@pytest.mark.parametrize(("sample", "rule", "share_of"), [
    ("vllm_cpu_prefill_heavy", "SCH004", ("ttft_engine_share_ratio", "server_ttft_split_engine_ratio")),
    ("vllm_cpu_kv_pressure", "SCH005", ("ttft_queue_share_ratio", "server_ttft_split_queue_ratio")),
    ("vllm_cpu_prefix_cache_miss", "SCH006", ("ttft_prefill_share_ratio", "server_ttft_split_prefill_ratio")),
    ("vllm_cpu_host_contention", "HST005", ("host_cpu_steal_or_contention_ratio",)),
])
def test_each_cause_says_what_share_of_the_symptom_it_explains(sample: str, rule: str,
                                                                share_of: tuple[str, ...]) -> None:
    v = analyze(SAMPLES / sample).verdict
    assert v is not None and v.top_rule == rule
    assert v.share is not None and 0.0 < v.share <= 1.0 and v.share_of in share_of, (v.share, v.share_of)


def test_the_burst_share_is_the_tails_excess_carried_by_requests_sent_in_a_burst() -> None:
    import pandas as pd

    from diagnose.normalize.client import _burst_tail_share

    # 30 requests one per second taking 0.1 s (in flight 0.1 on average), then 10 sent together at t=40
    sent = [float(i) for i in range(30)] + [40.0] * 10
    ttft = [20.0] * 30 + [200.0] * 10
    end = [s + t / 1000 + 0.1 for s, t in zip(sent, ttft, strict=True)]
    df = pd.DataFrame({"sent_s": sent, "end_s": end, "ttft_ms": ttft, "ok": True})
    # the client's mean in flight is 0.16, so a burst is 2 or more in flight: 8 of the 10 found that many
    assert _burst_tail_share(df) == pytest.approx(0.8)
    spaced = df.assign(sent_s=[float(i) for i in range(40)])
    spaced = spaced.assign(end_s=spaced["sent_s"] + spaced["ttft_ms"] / 1000 + 0.1)
    assert _burst_tail_share(spaced) == 0.0  # slow requests, but none arrived in a burst
    assert _burst_tail_share(df.head(10)) is None  # too few requests to speak of a tail
    v = analyze(SAMPLES / "vllm_cpu_bursty").verdict
    assert v is not None and v.top_rule == "SCH008" and v.share_of == "burst_tail_share_ratio"
    assert v.share is not None and 0.0 < v.share <= 1.0


def _finding(rule_id: str, severity: str, held_back: str = "", kind: str = "cause") -> Any:
    from diagnose.model import Finding

    return Finding(rule_id, rule_id.lower(), "scheduling", severity, f"{rule_id} title",  # type: ignore[arg-type]
                   f"{rule_id} hypothesis.", 0.9, 0.5, 0.5, kind=kind, held_back=held_back)


def test_a_verdict_never_says_no_bottleneck_beside_held_back_findings() -> None:
    """Issue 34: every finding at warning or above held back by a validity rule (its evidence suspect) made
    the verdict 'No bottleneck found at warning level or above' right above those findings. It says they are
    not judged, how many, what holds them back and the first of them; an info finding held back changes
    nothing, and one finding not held back leads as before."""
    sig = _sig({"requests_measured": 100.0})
    held = [_finding("SCH001", "error", "VAL002"), _finding("LAT001", "warning", "VAL004")]
    v = decide(held, sig, load_ran=True)
    assert v.level == "info" and v.headline.startswith("Not judged: 2 findings at warning or above held back")
    assert "(VAL002, VAL004)" in v.headline and "SCH001 title" in v.headline, v.headline
    assert "No bottleneck" not in v.headline and "not called a bottleneck" in v.detail
    assert v.top_rule == "SCH001"
    one = decide(held[:1], sig, load_ran=True)
    assert one.headline.startswith("Not judged: 1 finding at warning") and "(VAL002)" in one.headline
    quiet = decide([_finding("SCH001", "info", "VAL002")], sig, load_ran=True)
    assert quiet.level == "ok" and quiet.headline.startswith("No bottleneck found")
    lead = decide([*held, _finding("KV001", "warning")], sig, load_ran=True)
    assert lead.headline == "Most likely: KV001 title" and lead.top_rule == "KV001"
