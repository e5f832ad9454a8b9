"""The per-step table, its percentiles, the graph-mode sentence, and where they show (report lead, JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.trace import sections
from diagnose.trace import analyze_trace
from tests.trace.helpers import DATA
from tests.trace.test_finding_cases import _piecewise_trace, _v1_trace


def test_piecewise_graph_mode_sentence(tmp_path: Path) -> None:
    a = analyze_trace(_piecewise_trace(tmp_path))
    gm = a.tables["trace_graph_mode"].iloc[0]
    assert gm["mode"] == "piecewise" and gm["replays_per_step"] == 3 and gm["eager_kernels_per_step"] == 18
    assert gm["eager_gpu_share"] == pytest.approx(18 * 2 / (18 * 2 + 33 * 5))
    assert gm["idle_between_us_per_step"] > 0
    assert gm["sentence"].startswith("Piecewise graphs: 3 graph replays and 18 eager kernels per step")
    assert "A full graph would at most recover" in gm["sentence"]
    st = a.tables["trace_steps"]
    assert (st["gemm_us"] == 33 * 5).all() and (st["norm_elementwise_us"] == 18 * 2).all()
    pct = a.tables["trace_step_percentiles"]
    row = pct[(pct["step_type"] == "all") & pct["metric"].str.contains("gpu_dur_us")].iloc[0]
    assert row["steps"] == 10 and row["p50"] == pytest.approx(st["gpu_dur_us"].median())


def test_report_leads_with_steps_and_graph_mode(tmp_path: Path) -> None:
    a = analyze_trace(_v1_trace(tmp_path))
    secs = sorted(sections(a.tables), key=lambda s: s.order)
    assert [s.id for s in secs[:4]] == ["trace_overview", "trace_steps_lead", "trace_step_percentiles",
                                       "trace_step_table"]
    text = fmt_text(secs[1].payload.text)
    assert "10 steps (9 decode, 1 prefill; from vLLM V1 execute_model frames, kind from the GPU time" in text
    assert "Graph mode: Piecewise graphs:" in text  # one graph replay in 9 steps, an eager prefill


def test_one_step_trace_says_so() -> None:
    a = analyze_trace(DATA / "mi300x_vllm_decode_fullgraph_execution.json.gz")
    text = fmt_text(next(s for s in sections(a.tables) if s.id == "trace_steps_lead").payload.text)
    assert "1 step (1 decode" in text and "one step only" in text
    assert "Full graph: 1 graph replay and 13 eager kernels per step" in text


def test_json_carries_the_step_table(tmp_path: Path) -> None:
    from diagnose.cli.main import cli

    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["analyze", str(_v1_trace(tmp_path)), "-o", str(tmp_path / "r.html"),
                                   "--json", str(out)])
    assert res.exit_code in (0, 1, 2), res.output
    doc = json.loads(out.read_text())
    assert len(doc["trace"]["steps"]) == 10 and doc["trace"]["steps"][0]["step_type"] == "prefill"
    assert doc["trace"]["graph_mode"][0]["mode"] == "piecewise"
    assert any(r["metric"].startswith("GPU duration") for r in doc["trace"]["step_percentiles"])
