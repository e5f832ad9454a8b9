"""Issue 35 item 1: vLLM V1 nests the model runner's ``execute_model`` frame inside the worker's (and an
``execute_model`` annotation may wrap both): each step counts once, the prefill step is kept, and every
whole-trace figure is exact. The expected figures are counted by hand from the events tests/trace/synth.py
writes (its comment lists them), not from the code under test.

Before the fix the trace read as 20 steps (19 counted): the worker's copy of the prefill step had no kernel of
its own (each kernel goes to the innermost step), was typed decode and excluded as "profiler start"; its
kernels were then dropped from every window figure: GPU busy 38.1% instead of 52.3%, communication 11.8% of
GPU time instead of 13.9%, custom all-reduce 100% of communication instead of 47.4%, the NCCL kernel missing
from the top kernels; and step 1 read 1.37 ms "idle before the first kernel" while the GPU ran the prefill.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.trace import analyze_trace
from diagnose.trace.steps import outermost
from tests.trace.synth import CUSTOM_AR, NCCL_RING, write_nested_v1

# counted from the events (synth.py): 20 prefill GEMMs x 100 us + NCCL 400 us; 9 decode replays x (5 x 60 + 40)
PREFILL_GPU_US = 20 * 100 + 400
DECODE_GPU_US = 5 * 60 + 40
BUSY_US = PREFILL_GPU_US + 9 * DECODE_GPU_US  # no two kernels overlap
WINDOW_US = (11000 + 130 + 340) - 1040  # first kernel start to the last decode's all-reduce end
COMM_US = 400 + 9 * 40


@pytest.mark.parametrize("annotation", [False, True], ids=["frames", "annotation_around_frames"])
def test_nested_execute_model_counts_each_step_once(tmp_path: Path, annotation: bool) -> None:
    a = analyze_trace(write_nested_v1(tmp_path / "v1.json", annotation=annotation))
    st = a.tables["trace_steps"]
    assert len(st) == 10  # old code: 20
    assert st["step_type"].tolist() == ["prefill"] + ["decode"] * 9
    assert (st["excluded"] == "").all()  # old code: the prefill's outer copy excluded as "profiler start"
    assert st["source"].iloc[0] == ("vllm_v1_range" if annotation else "vllm_v1_frame")
    assert st["kernel_us"].tolist() == [PREFILL_GPU_US] + [DECODE_GPU_US] * 9
    assert st["dur_us"].tolist() == ([1010.0] + [610.0] * 9 if annotation else [1000.0] + [600.0] * 9)
    s = {x.name: x.value for x in a.signals}
    assert s["trace_steps_count"] == 10 and s["trace_step_prefill_count"] == 1
    assert s["trace_gpu_busy_ratio"] == pytest.approx(BUSY_US / WINDOW_US)  # 0.5235; old code 0.381
    cls = a.tables["trace_kernel_classes"].set_index("class")
    assert cls.loc["communication", "share_ratio"] == pytest.approx(COMM_US / BUSY_US)  # 0.139; old 0.118
    assert s["trace_custom_allreduce_ratio"] == pytest.approx(9 * 40 / COMM_US)  # 0.474; old 1.0
    top = a.tables["trace_top_kernels"].set_index("name")["total_ms"]
    assert top[NCCL_RING[:200]] == pytest.approx(0.4) and top[CUSTOM_AR[:200]] == pytest.approx(0.36)


def test_queued_work_before_the_first_kernel_is_not_idle(tmp_path: Path) -> None:
    """Step 1 starts on the CPU at 2050 while the GPU runs the prefill until 3440: its 1390 us before the first
    kernel are queued, not idle; steps 2-9 start on an idle GPU and wait 130 us for their replay."""
    st = analyze_trace(write_nested_v1(tmp_path / "v1.json")).tables["trace_steps"]
    assert st["queued_before_first_us"].tolist() == [0.0, 3440.0 - 2050.0] + [0.0] * 8
    assert st["idle_before_first_us"].tolist() == [40.0, 0.0] + [130.0] * 8  # old code: step 1 1370 us idle


def test_outermost_keeps_disjoint_and_partly_overlapping_rows() -> None:
    def r(ts: float, dur: float) -> dict[str, float]:
        return {"ts_us": ts, "dur_us": dur}
    rows = [r(0, 100), r(10, 80), r(10, 80), r(100, 50), r(140, 30), r(200, 10)]
    assert [(x["ts_us"], x["dur_us"]) for x in outermost(rows)] == [(0, 100), (100, 50), (140, 30), (200, 10)]
    same = [r(5, 10), r(5, 10)]
    assert outermost(same) == [same[0]]
