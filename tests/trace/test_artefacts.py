"""Issue 11, artefact guards: warm-up and profiler start/stop steps are excluded from step percentiles, graph
mode, step signals and findings, and shown labelled in the per-step table and JSON. On a real trace
(tests/data/traces, licenses in its README), on synthetic traces derived from a real one, and on the vLLM V1
shape of tests/trace/test_finding_cases.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.trace import sections
from diagnose.trace import analyze_trace
from diagnose.trace.analyze import TraceAnalysis
from tests.trace.helpers import DATA, kernel, launch, step_gpu_work, write_trace
from tests.trace.test_finding_cases import V1_FRAME, _findings, _pyframe, _sync, _v1_trace


def _sig(a: TraceAnalysis) -> dict[str, float]:
    return {s.name: s.value for s in a.signals}


def _excluded(a: TraceAnalysis) -> list[str]:
    return a.tables["trace_steps"]["excluded"].tolist()


def test_profiler_stop_cuts_the_last_step_of_a_real_trace() -> None:
    """MI250 ROCm trace: ProfilerStep#1 runs 9.3 ms, ProfilerStep#2 49 µs: the profiler stopped right after
    #2 began (its schedule's last step), so #2 is no step at all."""
    a = analyze_trace(DATA / "mi250_rocm6.2_minitoy_train.json.gz")
    exc = _excluded(a)
    assert exc[0] == "" and exc[1].startswith("profiler stop: cut short when the profiler stopped")
    s = _sig(a)
    assert s["trace_steps_count"] == 1 and s["trace_steps_excluded_count"] == 1
    assert s["trace_step_dur_p50_ms"] == pytest.approx(9.288, abs=0.001)  # #1 alone, not the median of both
    pct = a.tables["trace_step_percentiles"]
    assert (pct["steps"] == 1).all()
    assert a.tables["trace_step_summary"]["steps"].tolist() == [1]
    lead = fmt_text(next(s for s in sections(a.tables) if s.id == "trace_steps_lead").payload.text)
    assert "1 step excluded (1 profiler stop" in lead and "not in the percentiles or findings" in lead


def _renamed(tmp_path: Path, src: Path, rename: dict[str, str]) -> Path:
    """A real trace with some ProfilerStep annotations renumbered (the events otherwise unchanged)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("name") in rename:
            e["name"] = rename[e["name"]]
    out = tmp_path / src.name
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def test_profilerstep0_is_warm_up_on_a_trace_derived_from_a_real_one(tmp_path: Path) -> None:
    """HTA's A100 NCCL trace records ProfilerStep#4-#6 (a schedule with 4 wait/warm-up steps before them).
    Renumbered #0-#2, as a profiler without warm-up steps records them, #0 carries the start-up costs."""
    src = DATA / "a100_2rank_nccl_collective_args.json.gz"
    base = analyze_trace(src)
    assert _excluded(base) == ["", "", ""]  # numbered from 4: the schedule had its warm-up steps
    a = analyze_trace(_renamed(tmp_path, src, {"ProfilerStep#4": "ProfilerStep#0", "ProfilerStep#5": "ProfilerStep#1",
                                               "ProfilerStep#6": "ProfilerStep#2"}))
    exc = _excluded(a)
    assert exc[0].startswith("warm-up: ProfilerStep#0") and exc[1:] == ["", ""]
    s = _sig(a)
    assert s["trace_steps_count"] == 2 and s["trace_steps_excluded_count"] == 1
    st = a.tables["trace_steps"]
    assert s["trace_step_dur_p50_ms"] == pytest.approx(st["dur_us"].iloc[1:].median() / 1e3)
    assert a.tables["trace_graph_mode"]["steps"].tolist() == [2]


def _v1_with(tmp_path: Path, *, first_overhead_us: float = 0.0, first_mallocs: int = 0, cut_last: bool = False,
             prefill_first: bool = False) -> Path:
    """vLLM V1 shape: an execute_model frame per step, each decode one graph replay of 100 kernels (1.9 ms).
    ``first_overhead_us``: the first step's CPU side runs that much longer before its launch (the profiler's
    start-up cost); ``first_mallocs``: cudaMalloc calls in the first two steps (first-run allocation);
    ``cut_last``: a last frame of 50 µs with one kernel, closed when the profiler stopped."""
    evs: list[dict[str, Any]] = []
    corr = 0
    t = 0.0
    for step in range(8):
        start = t
        if step == 0:
            t += first_overhead_us
        if step < 2:
            for m in range(first_mallocs):
                evs.append(launch("cudaMalloc", t + m * 3, 2, 900_000 + 10 * step + m))
            t += 3 * first_mallocs
        work, t, corr = step_gpu_work(t, corr, eager=300 if prefill_first and step == 0 else 0)
        evs += work
        evs.append(_pyframe(V1_FRAME, start, t - start + 10))
        t += 200
    if cut_last:
        corr += 1
        evs += [launch("cudaLaunchKernel", t, 5, corr), kernel("gemm_bf16", t + 6, 10, corr),
                _pyframe(V1_FRAME, t, 50)]
    return write_trace(tmp_path / "v1_artefacts.json", evs)


def test_profiler_start_overhead_on_the_first_step(tmp_path: Path) -> None:
    a = analyze_trace(_v1_with(tmp_path, first_overhead_us=3000))
    exc = _excluded(a)
    assert exc[0].startswith("profiler start: CPU duration 4.93 ms, 2.6x the median of the 7 other decode steps")
    assert exc[1:] == [""] * 7
    s = _sig(a)
    assert s["trace_steps_count"] == 7 and s["trace_step_dur_p99_ms"] == pytest.approx(1.935)
    # the 3 ms before its launch would have been a host gap before the first kernel in the percentiles
    pct = a.tables["trace_step_percentiles"]
    gap = pct[(pct["step_type"] == "all") & pct["metric"].str.contains("idle_before_first_us")].iloc[0]
    assert gap["max"] < 100 and gap["steps"] == 7


def test_first_run_allocation_steps_are_warm_up(tmp_path: Path) -> None:
    a = analyze_trace(_v1_with(tmp_path, first_mallocs=4))
    exc = _excluded(a)
    assert exc[:2] == ["warm-up: 4 cudaMalloc/hipMalloc calls in the step (first-run allocation)"] * 2
    assert exc[2:] == [""] * 6 and _sig(a)["trace_steps_excluded_count"] == 2


def test_profiler_stop_mid_step_on_the_v1_shape(tmp_path: Path) -> None:
    a = analyze_trace(_v1_with(tmp_path, cut_last=True))
    exc = _excluded(a)
    assert len(exc) == 9 and exc[-1].startswith("profiler stop") and exc[:-1] == [""] * 8
    assert _sig(a)["trace_steps_count"] == 8


def test_a_real_first_step_is_kept(tmp_path: Path) -> None:
    """A prefill first (longer by its own work, the other steps decodes) and a steady trace: nothing excluded."""
    assert _excluded(analyze_trace(_v1_trace(tmp_path))) == [""] * 10
    assert _excluded(analyze_trace(_v1_with(tmp_path, prefill_first=True))) == [""] * 8
    assert _excluded(analyze_trace(_v1_with(tmp_path))) == [""] * 8


def test_excluded_steps_do_not_make_findings(tmp_path: Path) -> None:
    """Six steps of GPU work; only ProfilerStep#0 blocks 3 ms in a sync with the GPU idle (start-up): no
    'blocking host work' finding from the warm-up step."""
    evs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(6):
        start = t
        evs += [launch("cudaLaunchKernel", t, 5, 2 * i + 1), kernel("gemm_bf16", t + 10, 2000, 2 * i + 1)]
        t += 2030
        if i == 0:
            evs.append(_sync(t, 3000, 20_000))
            t += 3000
        evs.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 100, "tid": 100,
                    "ts": start, "dur": t - start})
        t += 50
    a = analyze_trace(write_trace(tmp_path / "warm.json", evs))
    assert _excluded(a)[0].startswith("warm-up") and "TRC004" not in _findings(a)
    s = _sig(a)
    assert s["trace_sync_in_step_ms"] == 0
    # the window-level figures leave the warm-up step out as well: its 3 ms of idle GPU would be ~23% idle
    assert s["trace_gpu_idle_ratio"] < 0.05 and s["trace_gpu_kernels_count"] == 5
    assert "trace_sync_total_ms" not in s  # its one sync was in the warm-up step


def test_json_and_table_show_the_label(tmp_path: Path) -> None:
    from diagnose.cli.main import cli

    path = _v1_with(tmp_path, first_overhead_us=3000, cut_last=True)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "r.html"), "--json", str(out)])
    assert res.exit_code in (0, 1, 2), res.output
    steps = json.loads(out.read_text())["trace"]["steps"]
    assert steps[0]["excluded"].startswith("profiler start") and steps[-1]["excluded"].startswith("profiler stop")
    assert all(s["excluded"] == "" for s in steps[1:-1])
    a = analyze_trace(path)
    tbl = next(s for s in sections(a.tables) if s.id == "trace_step_table").payload
    assert "excluded" in tbl.columns


def test_profiler_step_recorded_as_an_operator_is_a_step() -> None:
    """Kineto of 2021 (the tb_plugin test input) records ProfilerStep#2 as an operator, not an annotation."""
    a = analyze_trace(DATA / "gpu_metrics_input.json")
    st = a.tables["trace_steps"]
    assert len(st) == 1 and st["source"].iloc[0] == "profiler_step"
    assert st["dur_us"].iloc[0] == pytest.approx(13410) and st["excluded"].iloc[0] == ""
