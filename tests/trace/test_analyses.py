"""Each analysis on real traces (and small synthetic ones where an exact answer is needed)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.trace import sections as trace_sections
from diagnose.reports.sections_view import section_view
from diagnose.trace import analyze_trace
from diagnose.trace.classify import kernel_class
from diagnose.trace.parse import read_trace
from diagnose.trace.steps import parse_step_name
from diagnose.trace.timeline import clipped_union_len, overlap_len, union, union_len
from tests.trace.helpers import DATA, annotation, kernel, launch, write_trace


def test_interval_arithmetic() -> None:
    s = np.array([0.0, 5.0, 2.0, 20.0])
    e = np.array([3.0, 8.0, 4.0, 25.0])
    ms, me = union(s, e)
    assert ms.tolist() == [0.0, 5.0, 20.0] and me.tolist() == [4.0, 8.0, 25.0]
    assert union_len(s, e) == 12.0
    assert overlap_len((np.array([0.0]), np.array([10.0])), (np.array([5.0, 20.0]), np.array([15.0, 30.0]))) == 5.0
    got = clipped_union_len(ms, me, np.array([0.0, 2.0, 6.0, 30.0]), np.array([100.0, 6.0, 21.0, 40.0]))
    assert got.tolist() == [12.0, 3.0, 3.0, 0.0]


def test_gpu_time_and_idle_attribution_exact(tmp_path: Path) -> None:
    # stream 7: gemm_a [10,20]; gemm_b [25,35] launched at 12 while the GPU was busy (5 us gap: launch
    # overhead); gemm_c [100,110] launched at 90, after the GPU went idle at 60 (40 us host wait);
    # gemm_d [200,210] launched at 105 while busy, yet starts 90 us later (other).
    # stream 9: an NCCL kernel [30,60] overlaps compute on [30,35].
    evs = [launch("cudaLaunchKernel", 0, 2, 1), kernel("gemm_a", 10, 10, 1),
           launch("cudaLaunchKernel", 12, 2, 2), kernel("gemm_b", 25, 10, 2),
           launch("cudaLaunchKernel", 90, 2, 3), kernel("gemm_c", 100, 10, 3),
           launch("ncclLaunch", 20, 2, 4), kernel("ncclDevKernel_AllReduce", 30, 30, 4, stream=9),
           launch("cudaLaunchKernel", 105, 2, 5), kernel("gemm_d", 200, 10, 5)]
    a = analyze_trace(write_trace(tmp_path / "t.json", evs))
    g = a.tables["trace_gpu_time"].iloc[0]
    assert g["window_us"] == 200.0
    assert g["busy_us"] == 65.0  # [10,20] [25,60] [100,110] [200,210]
    assert g["compute_us"] == 40.0 and g["comm_total_us"] == 30.0
    assert g["comm_overlapped_us"] == 5.0 and g["comm_exposed_us"] == 25.0
    assert g["comm_overlap_ratio"] == pytest.approx(5 / 30)
    idle = a.tables["trace_idle"].iloc[0]  # gaps of the merged timeline: 20->25, 60->100, 110->200
    assert idle["launch_overhead_us"] == 5.0
    assert idle["host_wait_us"] == 40.0
    assert idle["other_us"] == 90.0
    sig = {s.name: s for s in a.signals}
    assert sig["trace_gpu_busy_ratio"].value == pytest.approx(65 / 200)
    assert sig["trace_gpu_idle_host_wait_ratio"].value == pytest.approx(40 / 135)
    assert all(s.source == "trace" for s in a.signals)


def test_tracelens_h100_gpu_timeline_within_1pp() -> None:
    """Inside the ProfilerStep GPU window TraceLens uses, busy/idle/compute match its expected CSV."""
    with (DATA / "h100_single_gpu_qwen1.5_0.5b_chat_tracelens_gpu_timeline.csv").open() as fh:
        exp = {r["type"]: float(r["time ms"]) for r in csv.DictReader(fh)}
    rt = read_trace(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz")
    win = rt.annotations[rt.annotations["where"] == "gpu"].iloc[0]
    lo, hi = win["ts_us"], win["ts_us"] + win["dur_us"]
    s = rt.gpu["ts_us"].to_numpy()
    e = s + rt.gpu["dur_us"].to_numpy()
    total = hi - lo
    assert total / 1e3 == pytest.approx(exp["total_time"], abs=1e-3)
    ms, me = union(s, e)
    busy = float(clipped_union_len(ms, me, np.array([lo]), np.array([hi]))[0])
    assert abs(100 * busy / total - 100 * exp["busy_time"] / exp["total_time"]) < 1.0
    assert abs(100 * (total - busy) / total - 100 * exp["idle_time"] / exp["total_time"]) < 1.0
    # and the whole-trace shares (window = first to last kernel, HTA's definition) are within 1 pp too
    g = analyze_trace(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz").tables["trace_gpu_time"].iloc[0]
    assert abs(100 * g["busy_ratio"] - 100 * exp["busy_time"] / exp["total_time"]) < 1.0
    assert abs(100 * g["compute_ratio"] - 100 * exp["computation_time"] / exp["total_time"]) < 1.0


def test_graph_launch_is_not_an_artefact() -> None:
    a = analyze_trace(DATA / "mi300x_vllm_decode_fullgraph_execution.json.gz")
    la = a.tables["trace_launch"].set_index("launch")
    assert la.loc["graph", "calls"] == 1 and la.loc["graph", "kernels"] == 421
    assert la.loc["kernel", "kernels"] == 4  # only eager kernels are compared with their launch call
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_graph_kernel_ratio"] == pytest.approx(421 / 425)
    st = a.tables["trace_steps"].iloc[0]
    assert st["step_type"] == "decode" and st["decode_reqs"] == 32
    assert 0 < st["gpu_busy_ratio"] <= 1.0


def test_launch_bound_small_kernels(tmp_path: Path) -> None:
    evs = []
    for i in range(10):  # 8 kernels of 2 us behind 5 us launch calls, 2 long ones
        t = 100.0 * i
        evs += [launch("cudaLaunchKernel", t, 5, i), kernel("elementwise_small", t + 6, 2 if i < 8 else 50, i)]
    a = analyze_trace(write_trace(tmp_path / "t.json", evs))
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_launch_bound_kernel_ratio"] == pytest.approx(0.8)
    assert sig["trace_launch_call_p50_us"] == 5.0 and sig["trace_launch_delay_p50_us"] == 1.0


def test_syncs_and_transfers() -> None:
    a = analyze_trace(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz")
    sync = a.tables["trace_sync"].set_index("call")
    assert sync.loc["cudaDeviceSynchronize", "count"] >= 1 and sync.loc["cudaDeviceSynchronize", "total_ms"] > 10
    tr = a.tables["trace_transfers"].set_index("direction")
    assert tr.loc["DtoH", "count"] == 1 and tr.loc["DtoH", "bytes"] == 1
    assert tr.loc["memset", "count"] == 241
    sig = {s.name: s.value for s in a.signals}
    st = a.tables["trace_steps"].iloc[0]
    assert st["sync_us"] > 10_000  # the 14 ms device sync sits inside ProfilerStep#6 ...
    # ... but the GPU was busy for all but ~0.7 ms of it: only that part blocks (issue 11, case 4)
    assert st["sync_blocking_us"] < 1_000 and sig["trace_sync_in_step_ms"] < 1.0
    assert sig["trace_sync_overlap_gpu_busy_ratio"] > 0.9


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"), ("Cijk_Alik_Bljk_BBS_BH_Bias", "gemm"),
    ("nvjet_tst_128x64", "gemm"), ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"), ("rcclGenericKernel", "communication"),
    ("void vllm::cross_device_reduce_1stage<bf16>", "communication"),
    ("void vllm::rms_norm_kernel<c10::BFloat16>", "norm_elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4>", "norm_elementwise"),
    ("void at::native::sbtopk::gatherTopK<float>", "sampling"), ("mystery_kernel", "other"),
])
def test_kernel_classes(name: str, kind: str) -> None:
    assert kernel_class(name) == kind


def test_kernel_class_tables_on_amd_trace() -> None:
    a = analyze_trace(DATA / "mi300x_sglang_qwen3_8b_decode.json.gz")
    cls = a.tables["trace_kernel_classes"].set_index("class")
    assert cls["share_ratio"].sum() == pytest.approx(1.0)
    assert cls.loc["gemm", "count"] > 0 and (cls["p99_us"] >= cls["mean_us"] * 0.999).any()
    top = a.tables["trace_top_kernels"]
    assert top["total_ms"].is_monotonic_decreasing and len(top) <= 25


@pytest.mark.parametrize("name, kind, pr, dr", [
    ("execute_context_1(200)_generation_0(0)", "prefill", 1, 0),
    ("execute_context_0(0)_generation_8(8)", "decode", 0, 8),
    ("execute_context_1(888_788544)_generation_3(3)", "mixed", 1, 3),
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)", "decode", 0, 32),
    ("step[DECODE bs=32]", "decode", 0, 32), ("step[EXTEND bs=4]", "prefill", 4, 0),
])
def test_step_names(name: str, kind: str, pr: int, dr: int) -> None:
    p = parse_step_name(name)
    assert p is not None and p["step_type"] == kind and p["prefill_reqs"] == pr and p["decode_reqs"] == dr
    assert parse_step_name("aten::mm") is None
    assert parse_step_name("ProfilerStep#3")["step_type"] == "step"  # type: ignore[index]


def test_cpu_only_vllm_trace_reports_steps_and_says_so() -> None:
    a = analyze_trace(DATA / "vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz")
    assert any("no GPU events" in w for w in a.warnings)
    names = {s.name for s in a.signals}
    assert not any(n.startswith("trace_gpu_") for n in names)  # missing input: absent, not zero
    assert "trace_sync_in_step_ms" not in names
    summ = a.tables["trace_step_summary"].set_index("step_type")
    assert summ.loc["decode", "steps"] == 22 and summ.loc["prefill", "steps"] == 2 and summ.loc["mixed", "steps"] == 1
    assert summ.loc["prefill", "tokens_mean"] == 200
    assert not a.tables["trace_cpu_ops"].empty
    first = trace_sections(a.tables)[0]
    assert first.kind == "text" and "CPU-only" in fmt_text(first.payload.text)


def test_mixed_step_inflation_and_decode_memory_bound(tmp_path: Path) -> None:
    evs = []
    t = 0.0
    for i, (ctx, gen, dur) in enumerate([(0, 4, 100), (0, 4, 110), (1, 4, 300), (0, 4, 100), (1, 4, 330)]):
        evs.append(annotation(f"execute_context_{ctx}({ctx * 64})_generation_{gen}({gen})", t, dur))
        evs.append(launch("cudaLaunchKernel", t + 1, 2, i * 2))
        evs.append(kernel("void vllm::rms_norm_kernel", t + 5, 30, i * 2))
        evs.append(launch("cudaLaunchKernel", t + 4, 2, i * 2 + 1))
        evs.append(kernel("sm90_xmma_gemm", t + 40, 10, i * 2 + 1))
        t += dur + 20
    a = analyze_trace(write_trace(tmp_path / "t.json", evs))
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_step_decode_count"] == 3 and sig["trace_step_mixed_count"] == 2
    assert sig["trace_mixed_step_inflation_ratio"] == pytest.approx(315 / 100)
    assert sig["trace_decode_memory_bound_ratio"] == pytest.approx(30 / 40)
    assert sig["trace_inter_step_gap_p50_ms"] == pytest.approx(0.02)


def test_multi_rank_directory() -> None:
    a = analyze_trace(DATA / "sampled_128rank")
    assert a.summary["ranks"] == [0, 1]
    g = a.tables["trace_gpu_time"]
    assert sorted(g["rank"]) == [0, 1]
    rk = a.tables["trace_rank_skew"]
    assert rk["times_last"].sum() == len(a.tables["trace_collectives"]) > 0
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_collective_skew_p50_us"] >= 0 and 0.5 <= sig["trace_straggler_last_share_ratio"] <= 1
    assert "trace_rank_busy_spread_ratio" in sig


def test_sections_are_plain_data() -> None:
    import json

    a = analyze_trace(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz")
    secs = trace_sections(a.tables)
    kinds = {s.kind for s in secs}
    assert {"text", "table", "stacked_bars", "histogram"} <= kinds
    views = [section_view(s) for s in secs]
    assert all(v["kind"] != "unavailable" for v in views)
    json.dumps(views, allow_nan=False)  # NaN became None
    for v in views:
        if v["kind"] == "table":
            assert all(len(r) == len(v["columns"]) for r in v["rows"])
    # numbers carry the unit of their column
    g = next(s for s in secs if s.id == "trace_gpu_time").payload
    busy = g.rows[0][g.columns.index("busy_us")]
    assert busy.unit == "us" and busy.value == pytest.approx(float(a.tables["trace_gpu_time"]["busy_us"].iloc[0]),
                                                              abs=1e-4)


def test_vllm_profiler_dir_skips_the_api_server_trace(tmp_path: Path) -> None:
    import shutil

    src = DATA / "vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz"
    shutil.copyfile(src, tmp_path / "rank0.1790857026.pt.trace.json.gz")
    shutil.copyfile(src, tmp_path / "vm_22490.async_llm.1790857026.pt.trace.json.gz")
    a = analyze_trace(tmp_path)
    assert a.summary["ranks"] == [0] and len(a.tables["trace_steps"]) == 27
    assert any("skipped the API-server trace" in w for w in a.warnings)
    assert "skipped the API-server trace" in fmt_text(trace_sections(a.tables)[0].payload.text)
    assert "skipped the API-server trace" in a.tables["trace_warnings"]["message"].iloc[-1]
    # alone, the frontend file is analysed as asked
    assert analyze_trace(tmp_path / "vm_22490.async_llm.1790857026.pt.trace.json.gz").summary["ranks"] == [0]
