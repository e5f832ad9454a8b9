"""The bundle normaliser (torch_trace artifacts) and the TRC rules fed by signals of real traces."""

from __future__ import annotations

import shutil
from pathlib import Path

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import trace as trace_norm
from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections import build_sections
from diagnose.reports.sections.trace import sections as trace_sections
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from tests.trace.helpers import DATA


def _bundle(tmp_path: Path, files: dict[str, tuple[str, str]]) -> Path:
    bw = BundleWriter(tmp_path / "b")
    (bw.path / "artifacts" / "profiler").mkdir(parents=True, exist_ok=True)
    for dest, (src, role) in files.items():
        shutil.copyfile(src, bw.artifact_path(f"profiler/{dest}"))
        bw.add_artifact(f"profiler/{dest}", "torch_trace", "profiler output", role=role, rank=0)
    bw.finish()
    return bw.path


def test_normaliser_reads_worker_traces_from_a_bundle(tmp_path: Path) -> None:
    p = _bundle(tmp_path, {
        "rank0.1.pt.trace.json.gz": (str(DATA / "vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz"), "worker"),
        # the API-server trace is left out (no kernels, no steps); a broken one must not matter either
        "vm_1.async_llm.2.pt.trace.json.gz": (str(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"), "frontend"),
    })
    b = open_bundle(p)
    tables = trace_norm.tables(b)
    assert tables["trace_steps"]["rank"].tolist() == [0] * 27
    assert tables["trace_gpu_time"].empty  # CPU-only worker; the frontend file (a GPU trace here) was skipped
    sig = {s.name: s for s in trace_norm.signals(tables, Window(0.0, 1e9))}
    assert sig["trace_steps_count"].value == 27 and sig["trace_steps_count"].source == "trace"
    # a phase window: signals only when the traced span (baseTimeNanoseconds) lies inside it
    assert trace_norm.signals(tables, Window(0.0, 1.0, phase=0, label="p0")) == []
    secs = trace_sections(tables)
    assert secs and secs[0].id == "trace_overview" and "CPU-only" in fmt_text(secs[0].payload.text)
    # the trace's own tables: a one-row summary, one row per rank, no joined strings
    summ = tables["trace_summary"]
    assert len(summ) == 1 and summ["files"].iloc[0] == 1 and summ["ranks"].iloc[0] == 1
    assert summ["steps"].iloc[0] == 27 and not summ["gpu"].iloc[0]
    assert tables["trace_ranks"]["rank"].tolist() == [0] and tables["trace_ranks"]["file"].str.contains("rank0").all()
    assert len(tables["trace_span"]) == 1 and tables["trace_span"]["end_s"].iloc[0] > tables["trace_span"]["start_s"].iloc[0]


def test_normaliser_turns_a_broken_trace_into_a_warning(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes((DATA / "mi300x_sglang_qwen3_8b_decode.json.gz").read_bytes()[:500])
    b = open_bundle(_bundle(tmp_path, {"rank0.pt.trace.json.gz": (str(bad), "worker")}))
    tables = trace_norm.tables(b)
    assert "truncated gzip" in tables["trace_warnings"]["message"][0]
    assert trace_norm.signals(tables, Window(0.0, 1.0)) == []
    assert "truncated gzip" in fmt_text(trace_sections(tables)[0].payload.text)


def test_bundle_without_traces_gives_no_tables(tmp_path: Path) -> None:
    assert trace_norm.tables(open_bundle(_bundle(tmp_path, {}))) == {}


def _fired(path: Path) -> set[str]:
    sig = {s.name: s for s in analyze_trace(path).signals}
    res = evaluate([r for r in load_rules() if r.family == "trace"], sig, load_thresholds())
    return {f.rule_id for f in res.findings}


def test_trace_rules_on_real_traces() -> None:
    # H100 Qwen: a 14 ms cudaDeviceSynchronize inside the 47 ms ProfilerStep, but the GPU ran kernels through
    # all but ~0.7 ms of it (92% busy run): not host blocking (issue 11, cases 4 and 6)
    assert "TRC004" not in _fired(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz")
    # vLLM decode with a full HIP graph: no launch-bound finding from the 421 graph kernels
    assert "TRC001" not in _fired(DATA / "mi300x_vllm_decode_fullgraph_execution.json.gz")


def test_pipeline_end_to_end_with_a_gpu_trace(tmp_path: Path) -> None:
    from diagnose.pipeline import analyze_bundle
    from diagnose.reports.render import render_html

    p = _bundle(tmp_path, {"rank0.pt.trace.json.gz": (str(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"),
                                                      "worker")})
    a = analyze_bundle(p)
    assert a.signals["trace_gpu_busy_ratio"].source == "trace"
    # GPU-bound (92% busy; the 14 ms sync overlaps GPU work): no trace finding (issue 11, cases 4 and 6)
    assert not {f.rule_id for f in a.findings if f.rule_id.startswith("TRC")}
    ids = {s.id for s in build_sections(a.tables)}
    assert {"trace_overview", "trace_gpu_time", "trace_kernel_classes", "trace_launch"} <= ids
    html = render_html(a)
    assert "Kernel classes" in html and "cudaDeviceSynchronize" in html
