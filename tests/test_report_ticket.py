"""A report a ticket reader trusts (issue 32 item 6): each thing said once, and only the sections a page's kind
can fill.

- A finding whose best cause proposes the same experiment as a higher-ranked one (SCH003 under SCH001: both
  raise max_num_seqs to 16) is an "also seen" entry folded inside that card, not a second card; --json keeps
  every finding.
- The verdict's headline and hypothesis appear once on the page: the first card does not repeat them.
- A kernel trace's hero states its symptom once (it said 'GPU idle 22% ... (454 idle gaps, 7 steps)' three
  times: headline, detail, symptom line).
- A kernel-trace page and a fleet page show their own headline tiles (from their signals) and none of the
  request sections (latency, distributions, timeline, workload charts), which printed seven "not available"
  lines on each before.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from markupsafe import escape

from diagnose.analysis import Analysis
from diagnose.cli.main import cli
from diagnose.model import Cause, Experiment, Finding
from diagnose.pipeline import analyze
from diagnose.reports.render import render_html
from diagnose.reports.view_model import build_view, folds, page_kind, restated
from tests.fleet_prom import FakePrometheus, load_recording, serve

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if (p / "expected_findings.json").exists())
IDLE = ROOT / "sample_traces" / "h200_toy_idle_between_steps" / "bundle"
TRACE = next((IDLE / "artifacts" / "profiler").glob("*.pt.trace.json.gz"))
BARE_TRACE = ROOT / "tests" / "data" / "traces" / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"
NOT_AVAILABLE = re.compile(r"not available")


def _section(html: str, sid: str) -> str:
    start = html.index(f'<section id="{sid}"')
    return html[start: html.index("</section>", start)]


@pytest.fixture(scope="module")
def trace() -> tuple[Analysis, str]:
    a = analyze(TRACE)
    return a, render_html(a)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, str]:
    out = tmp_path_factory.mktemp("fleet") / "b"
    fake = FakePrometheus(load_recording())
    with serve(fake) as url:
        r = CliRunner().invoke(cli, ["attach", "--prometheus", url, "--selector", '{job="vllm"}', "--since", "40s",
                                     "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    a = analyze(out)
    return a, render_html(a)


# -- 1. a finding that restates another folds into it -------------------------------------------------------
@pytest.mark.parametrize("name", ["vllm_cpu_queue_bound", "vllm_cpu_queue_bound_sweep"])
def test_sch003_folds_into_sch001_with_the_same_experiment(name: str) -> None:
    a = analyze(ROOT / "sample_traces" / name / "bundle")
    assert {"SCH001", "SCH003"} <= {f.rule_id for f in a.findings}  # the judgement (and --json) keeps both
    view = build_view(a)
    cards = [f["rule_id"] for f in view["findings"]]
    assert "SCH003" not in cards and cards[0] == "SCH001"
    sch001 = view["findings"][0]
    (also,) = sch001["also_seen"]
    assert also["rule_id"] == "SCH003" and also["why"] == "proposes the same experiment: max_num_seqs = 16"
    # only what the card does not already show: SCH003's other evidence and its other candidate cause
    assert {e["signal"] for e in also["evidence"]}.isdisjoint(e["signal"] for e in sch001["evidence"])
    assert [c["cause"] for c in also["causes"]] == ["the cap protects ITL on purpose (larger batches slow every step)"]
    html = render_html(a)
    assert html.count('<article class="finding') == len(cards)
    title = str(escape(next(f.title for f in a.findings if f.rule_id == "SCH003")))
    assert html.count(title) == 1 and "Also seen:" in html
    assert title not in "".join(re.findall(r"<h3>.*?</h3>", html))  # not a card's heading


def _finding(rule: str, severity: str, value: str, family: str = "scheduler", **kw: str) -> Finding:
    exp = Experiment("raise the cap", (("queue_depth_mean", "down"),), "engine_flag", "max_num_seqs", value)
    return Finding(rule, rule.lower(), family, severity, f"{rule} title", f"{rule} text", 0.7, 0.5, 1.0,  # type: ignore[arg-type]
                   causes=(Cause("the cap", status="supported", experiment=exp),), **kw)


def test_folding_rule() -> None:
    top, same, other = _finding("A1", "error", "16"), _finding("B1", "warning", "16"), _finding("C1", "warning", "8")
    assert folds([top, same, other]) == {"B1": "A1"}  # the same flag to the same value; another value is its own
    assert folds([top, same], top_rule="B1") == {}  # the verdict's own finding keeps its card
    assert folds([_finding("A1", "warning", "16"), _finding("B1", "error", "16")]) == {}  # never under a milder card
    assert folds([top, _finding("V1", "warning", "16", family="validity")]) == {}  # validity judges the run
    assert folds([top, _finding("B1", "warning", "16", held_back="VAL001")]) == {}
    assert folds([top, _finding("B1", "warning", "16", explained_by="Z9")]) == {}  # a third finding's consequence
    assert folds([top, _finding("B1", "warning", "16", explained_by="A1")]) == {"B1": "A1"}


# -- 2. the verdict's sentence once --------------------------------------------------------------------------
@pytest.mark.parametrize("source", [*(s / "bundle" for s in SAMPLES), TRACE],
                         ids=[*(s.name for s in SAMPLES), "h200_trace"])
def test_the_verdict_sentence_appears_once(source: Path) -> None:
    a = analyze(source)
    html = render_html(a)
    v = a.verdict
    assert v is not None
    top = next((f for f in a.findings if f.rule_id == v.top_rule), None)
    if top is None:
        pytest.skip(f"{source}: the verdict names no finding")
    assert html.count(str(escape(top.title))) == 1, "the verdict's title is repeated"
    assert html.count(str(escape(top.hypothesis))) <= 1, "the verdict's hypothesis is repeated"
    assert html.count(str(escape(v.headline))) == 1
    card = build_view(a)["findings"][0]
    assert card["rule_id"] == top.rule_id and card["in_verdict"]
    assert "The verdict above" in html[html.index('<section id="findings"'):]


# -- 3. a trace's hero states its symptom once ---------------------------------------------------------------
@pytest.mark.parametrize("source", [TRACE, IDLE], ids=["trace_file", "bundle_with_trace"])
def test_the_trace_hero_states_the_symptom_once(source: Path) -> None:
    a = analyze(source)
    html = render_html(a)
    assert a.verdict is not None and "454 idle gaps" in a.verdict.headline
    hero = _section(html, "verdict")
    assert hero.count("454 idle gaps") == 1, "the symptom is stated more than once in the verdict"
    # the judgement's own texts are unchanged (the CLI and --json print them whole)
    assert a.verdict.detail.startswith("Symptom: the GPU is idle 22%") and "454 idle gaps" in a.verdict.symptom
    if source == IDLE:  # the user's symptom stays; only its kernel-trace clause restated the headline
        serving = a.verdict.symptom.split("; in the kernel trace: ")[0]
        assert f"<b>Symptom:</b> {escape(serving)}</div>" in hero
    else:
        assert '<div class="symptom">' not in hero


@pytest.mark.parametrize("name", ["vllm_cpu_queue_bound", "h200_toy_host_bound"])
def test_a_symptom_with_figures_the_headline_lacks_stays_whole(name: str) -> None:
    """h200_toy_host_bound's detail quotes the symptom's figures and says 'the symptom says which': the line
    that says which (poor ITL, normal TTFT) stays."""
    a = analyze(ROOT / "sample_traces" / name / "bundle")
    assert a.verdict is not None and a.verdict.symptom
    assert f"<b>Symptom:</b> {escape(a.verdict.symptom)}</div>" in _section(render_html(a), "verdict")


def test_restated() -> None:
    head = "Most likely: GPU idle 22% of the trace, 92% of it waiting for the CPU (454 idle gaps, 7 steps)"
    assert restated("GPU idle 22% of the traced window (454 idle gaps, 7 steps)", head)
    assert not restated("High TTFT (P99 4422 ms) with normal ITL (P99 91.0 ms)", head)
    assert not restated("GPU idle 30% of the traced window (454 idle gaps, 7 steps)", head)
    assert restated("waiting for the CPU", head) and not restated("the batch is full", head)


# -- 4. trace and fleet pages: their own tiles, no request sections --------------------------------------------
@pytest.mark.parametrize("kind", ["trace", "fleet"])
def test_trace_and_fleet_pages_have_tiles_and_no_request_sections(kind: str, request: pytest.FixtureRequest) -> None:
    a, html = request.getfixturevalue(kind)
    assert page_kind(a) == kind
    view = build_view(a)
    assert view["percentiles"] is None and view["charts"] == {}
    assert NOT_AVAILABLE.findall(html) == [], "a request section that cannot apply says 'not available'"
    assert 'id="latency"' not in html
    tiles = view["verdict"]["key_numbers"]
    want = {"trace": {"trace_gpu_busy_ratio", "trace_step_dur_p50_ms", "trace_steps_count"},
            "fleet": {"fleet_replicas", "fleet_load_mean", "fleet_load_imbalance_ratio"}}[kind]
    assert want <= {k["signal"] for k in tiles}
    for k in tiles:  # each tile is a signal as computed, never a number made by the view
        assert k["value"] == pytest.approx(a.signals[k["signal"]].value)
    assert _section(html, "verdict").count('<div class="key">') == len(tiles)


def test_bare_trace_page_omits_probes_it_never_had() -> None:
    html = render_html(analyze(BARE_TRACE))
    assert 'id="probes"' not in html and "not available" not in html and '<div class="key">' in html


def test_a_serving_page_still_says_what_is_missing() -> None:
    a = Analysis(source="empty", manifest={})
    assert page_kind(a) == "serving"
    assert "TTFT distribution: not available" in render_html(a)


def test_a_fleet_page_lists_only_the_fleet_rules_it_could_not_evaluate(fleet: tuple[Analysis, str]) -> None:
    """A fleet capture (per-replica aggregates from Prometheus, no request) listed 48 request, server and GPU
    rules as "not evaluated" although nothing it holds could ever feed them; like a trace, it lists only the
    rules its kind of evidence could have fed. The same rules on a serving capture are still listed."""
    a, html = fleet
    assert all(m.startswith("fleet_") for n in a.not_evaluated for m in n.missing), a.not_evaluated
    assert not any(n.rule_id.startswith(("SCH", "LAT", "GPU", "KV")) for n in a.not_evaluated)
    assert {f.rule_id for f in a.findings} & {"FLT001", "FLT002"}, [f.rule_id for f in a.findings]
    assert "GPU001" not in html
    serving = analyze(ROOT / "sample_traces" / "vllm_cpu_healthy" / "bundle")
    assert any(n.rule_id.startswith("GPU") for n in serving.not_evaluated)


def test_a_bundle_holding_only_a_kernel_trace_is_judged_as_a_trace(tmp_path: Path) -> None:
    """The input's kind is decided once, by the pipeline (Analysis.input_kind): a capture whose only evidence is a
    kernel trace shows the trace page AND lists as "not evaluated" only the rules a trace could have fed. Before,
    the page called it a trace while the pipeline, judging by the manifest's kind alone, listed every request
    and server rule as not evaluated."""
    import shutil

    from diagnose.io.writer import BundleWriter

    bw = BundleWriter(tmp_path / "b")
    shutil.copy(BARE_TRACE, bw.artifact_path(BARE_TRACE.name))
    bw.add_artifact(BARE_TRACE.name, "torch_trace", "a kernel trace, the capture's only evidence")
    bw.finish()
    a = analyze(tmp_path / "b")
    assert a.input_kind == "trace" and page_kind(a) == "trace"
    missing = [m for n in a.not_evaluated for m in n.missing]
    assert missing and all(m.startswith("trace_") for m in missing), missing
    assert a.meta.kind == "capture"  # a bundle, not a lone trace file: the kind came from its evidence
