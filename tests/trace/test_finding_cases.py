"""Issue 11's eight failure cases: each on a real trace (tests/data/traces, /work/shared/traces when present) or
on a small synthetic trace built at test time, asserting the finding an engineer would sign."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from diagnose.trace.analyze import TraceAnalysis
from tests.trace.helpers import DATA, annotation, kernel, launch, step_gpu_work, write_trace

V1_FRAME = "vllm/v1/worker/gpu_model_runner.py(3380): execute_model"


def _findings(a: TraceAnalysis) -> dict[str, Any]:
    sig = {s.name: s for s in a.signals}
    res = evaluate([r for r in load_rules() if r.family == "trace"], sig, load_thresholds())
    return {f.rule_id: f for f in res.findings}


def _sig(a: TraceAnalysis) -> dict[str, float]:
    return {s.name: s.value for s in a.signals}


def _pyframe(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur}


def _sync(ts: float, dur: float, corr: int) -> dict[str, Any]:
    return launch("cudaDeviceSynchronize", ts, dur, corr)


# --- case 1: graph replay counted as launch overhead -------------------------------------------------------

def _piecewise_trace(tmp_path: Path) -> Path:
    """10 decode steps. Each: 3 times, the CPU launches 6 eager 2 us kernels (5 us launch calls), then a graph
    replay of 11 kernels of 5 us with 3 us gaps inside the replay; the GPU runs it all 1.3 ms behind the CPU
    (the CPU is ahead, the eager kernels queue). 65% of kernels run in graph replays, as in the issue's vLLM
    run (64%)."""
    evs: list[dict[str, Any]] = []
    corr = 0
    for step in range(10):
        t0 = step * 3000.0
        gpu_t = t0 + 1300.0
        cpu_t = t0
        for _r in range(3):
            for _e in range(6):  # eager kernels between replays
                corr += 1
                evs += [launch("cudaLaunchKernel", cpu_t, 5, corr), kernel("rms_norm_kernel", gpu_t, 2, corr)]
                cpu_t += 10
                gpu_t += 2.5
            corr += 1
            evs.append(launch("cudaGraphLaunch", cpu_t, 20, corr))
            cpu_t += 30
            for _k in range(11):
                evs.append(kernel("gemm_bf16", gpu_t, 5, corr))
                gpu_t += 8  # 3 us gap inside the replay
        evs.append(annotation(f"execute_context_0(0)_generation_32(32)_{step}", t0, 2900))
    return write_trace(tmp_path / "piecewise.json", evs)


def test_case1_graph_replay_gaps_are_not_launch_overhead(tmp_path: Path) -> None:
    a = analyze_trace(_piecewise_trace(tmp_path))
    s = _sig(a)
    assert s["trace_graph_kernel_ratio"] == pytest.approx(33 / 51)
    assert s["trace_eager_kernel_ratio"] == pytest.approx(18 / 51)  # the launch-bound ratio's denominator
    assert s["trace_launch_bound_kernel_ratio"] == 1.0  # every eager kernel is shorter than its launch call ...
    assert s["trace_launch_delay_p50_us"] > 1000  # ... but they queue: the CPU is ahead
    idle = a.tables["trace_idle"].iloc[0]
    assert idle["graph_internal_us"] == pytest.approx(10 * 3 * 10 * 3.0)  # 3 us gaps inside the replays
    assert idle["launch_explained_us"] == 0
    f = _findings(a)
    assert "TRC001" not in f  # old code: "100% of kernels are shorter than their launch call ... enable CUDA graphs"


def test_case1_launch_bound_eager_trace_still_fires(tmp_path: Path) -> None:
    """Eager, CPU behind: 2 us kernels start 1 us after 5 us launch calls, 8 us host gaps: launch-paced."""
    evs: list[dict[str, Any]] = []
    for i in range(200):
        evs += [launch("cudaLaunchKernel", 10.0 * i, 5, i + 1), kernel("elementwise_small", 10.0 * i + 6, 2, i + 1)]
    a = analyze_trace(write_trace(tmp_path / "eager.json", evs))
    f = _findings(a)
    assert "TRC001" in f and "eager kernels (100% of all kernels)" in f["TRC001"].title


# --- case 2: vLLM V1 steps from execute_model frames ---------------------------------------------------------

def _v1_trace(tmp_path: Path) -> Path:
    """vLLM V1 shape: no step annotation, one execute_model frame per step (among other Python frames); one
    eager 9 ms prefill of 300 kernels and nine 1.9 ms decodes of one graph replay each."""
    evs: list[dict[str, Any]] = []
    corr = 0
    t = 0.0
    for step in range(10):
        prefill = step == 0
        start = t
        evs.append(_pyframe("vllm/v1/worker/gpu_worker.py(400): execute_model_wrapper", t - 5, 1))
        work, t, corr = step_gpu_work(t, corr, eager=300 if prefill else 0)
        evs += work
        evs.append(_pyframe(V1_FRAME, start, t - start + 10))
        evs.append(_pyframe("torch/nn/modules/module.py(1750): _call_impl", start + 1, 2))
        t += 200
    return write_trace(tmp_path / "v1.json", evs)


def test_case2_v1_steps_from_execute_model_frames(tmp_path: Path) -> None:
    a = analyze_trace(_v1_trace(tmp_path))  # default: no include_python
    st = a.tables["trace_steps"]
    assert len(st) == 10 and (st["source"] == "vllm_v1_frame").all()
    assert st["step_type"].tolist() == ["prefill"] + ["decode"] * 9
    assert st["gpu_dur_us"].iloc[0] == pytest.approx(299 * 30 + 30)  # from its kernels
    assert st["gpu_dur_us"].iloc[1:].tolist() == pytest.approx([99 * 19 + 18] * 9)
    assert st["graph_replays"].iloc[1:].tolist() == [1] * 9 and st["eager_kernels"].iloc[0] == 300
    assert "inferred" in st["kind_from"].iloc[0]
    s = _sig(a)
    assert s["trace_step_prefill_count"] == 1 and s["trace_step_decode_count"] == 9
    assert "trace_python_functions" not in a.tables  # the other frames are dropped


def test_case2_include_python_adds_a_documented_table(tmp_path: Path) -> None:
    a = analyze_trace(_v1_trace(tmp_path), include_python=True)
    py = a.tables["trace_python_functions"]
    assert V1_FRAME in set(py["name"]) and "torch/nn/modules/module.py(1750): _call_impl" in set(py["name"])
    from diagnose.reports.sections.trace import sections
    assert "trace_python_functions" in {s.id for s in sections(a.tables)}


def test_case2_real_v1_frame_without_annotation(tmp_path: Path) -> None:
    """The real MI300X vLLM trace with its execute_* annotation removed: the V1 frame still gives the step."""
    doc = json.loads(gzip.decompress((DATA / "mi300x_vllm_decode_fullgraph_execution.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not (e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("execute_"))]
    p = tmp_path / "v1_real.json"
    p.write_text(json.dumps(doc))
    st = analyze_trace(p).tables["trace_steps"]
    assert len(st) == 1 and st["source"].iloc[0] == "vllm_v1_frame"
    assert st["graph_replays"].iloc[0] == 1 and st["gpu_dur_us"].iloc[0] > 10_000  # the replay runs ~10.7 ms


# --- case 3: work launched before the trace began ------------------------------------------------------------

def test_case3_sglang_decode_pre_trace_window_is_not_host_wait() -> None:
    a = analyze_trace(DATA / "mi300x_sglang_qwen3_8b_decode.json.gz")
    idle = a.tables["trace_idle"].iloc[0]
    assert idle["pre_trace_us"] == pytest.approx(463_252, abs=50)  # a kernel launched at 0.12 ms ran 463 ms later
    s = _sig(a)
    assert s["trace_gpu_idle_ratio"] < 0.1 and s["trace_gpu_pre_trace_ms"] > 400
    assert "TRC002" not in _findings(a)  # old code: error "GPU idle 98%, 100% waiting for the CPU"


# --- case 4: syncs during GPU-bound work ---------------------------------------------------------------------

def test_case4_sync_during_gpu_work_is_not_host_blocking() -> None:
    a = analyze_trace(DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz")
    st = a.tables["trace_steps"].iloc[0]
    assert st["sync_us"] > 14_000 and st["sync_blocking_us"] < 1_000
    assert "TRC004" not in _findings(a)  # old code: "syncs 30% of step time"


def _sync_steps(tmp_path: Path, n_steps: int, blocking_steps: set[int]) -> Path:
    """Steps of 2 ms of GPU work; in ``blocking_steps`` the CPU then waits 1 ms in a sync with the GPU idle
    (it waits for a copy that has finished: the GPU has nothing to run)."""
    evs: list[dict[str, Any]] = []
    t = 0.0
    for i in range(n_steps):
        start = t
        evs += [launch("cudaLaunchKernel", t, 5, 2 * i + 1), kernel("gemm_bf16", t + 10, 2000, 2 * i + 1)]
        t += 2010
        evs.append(_sync(t, 20, 10_000 + i))  # waits for the kernel's end: GPU busy, not blocking
        t += 20
        if i in blocking_steps:
            evs.append(_sync(t, 1000, 20_000 + i))
            t += 1000
        evs.append(annotation(f"ProfilerStep#{i + 1}", start, t - start))  # #0 would be a warm-up step
        t += 50
    return write_trace(tmp_path / f"sync_{n_steps}_{len(blocking_steps)}.json", evs)


def test_case4_sync_with_the_gpu_idle_still_fires(tmp_path: Path) -> None:
    a = analyze_trace(_sync_steps(tmp_path, 6, set(range(6))))
    f = _findings(a)
    assert "TRC004" in f and "in 6 of 6 steps" in f["TRC004"].title


# --- case 6: one step leads the report -----------------------------------------------------------------------

def test_case6_one_step_of_many_cannot_lead(tmp_path: Path) -> None:
    a = analyze_trace(_sync_steps(tmp_path, 10, {4}))
    s = _sig(a)
    assert s["trace_sync_in_step_ratio"] > 0.04 and s["trace_sync_blocking_steps_count"] == 1
    assert "TRC004" not in _findings(a)  # old code: "syncs 5% of step time" from that one step


def test_case6_a_one_step_trace_says_so(tmp_path: Path) -> None:
    f = _findings(analyze_trace(_sync_steps(tmp_path, 1, {0})))
    assert "TRC004" in f and "in 1 of 1 steps" in f["TRC004"].title
    for rid, fd in f.items():  # every trace finding names its sample size
        assert "step" in fd.title or "collectives" in fd.title or "capture" in fd.title, (rid, fd.title)


# --- case 5: waiting for peer ranks counted as communication cost --------------------------------------------

def _tp_trace(tmp_path: Path, first_wait_us: float, ar_us: float, name: str) -> Path:
    """One rank of TP: 14 steps of 30 layers (gemm 40 us, then an all-reduce); the first all-reduce of each
    step runs ``first_wait_us`` (waiting for a late peer), the others ``ar_us``."""
    evs: list[dict[str, Any]] = []
    t = 0.0
    corr = 0
    for step in range(14):
        start = t
        for layer in range(30):
            corr += 1
            evs += [launch("cudaLaunchKernel", t, 4, corr), kernel("gemm_bf16", t + 5, 40, corr)]
            t += 45
            corr += 1
            d = first_wait_us if layer == 0 else ar_us
            evs += [launch("cudaLaunchKernel", t - 40, 4, corr), kernel(name, t + 0.5, d, corr)]
            t += d + 1
        evs.append(annotation(f"execute_context_0(0)_generation_8(8)_{step}", start, t - start))
        t += 5
    return write_trace(tmp_path / f"tp_{int(first_wait_us)}_{int(ar_us)}.json", evs)


def test_case5_first_of_step_allreduce_outliers_are_wait(tmp_path: Path) -> None:
    a = analyze_trace(_tp_trace(tmp_path, 2000, 7, "void vllm::cross_device_reduce_1stage<bf16, 4>"))
    cs = a.tables["trace_comm_split"].iloc[0]
    assert cs["impl"] == "custom all-reduce" and cs["wait_kernels"] == 14
    assert cs["wait_us"] == pytest.approx(14 * (2000 - 7), rel=1e-6)
    f = _findings(a)
    assert "TRC003" not in f  # old code: "communication exposed ... enable custom all-reduce"
    assert "TRC007" in f and "14 of 420 collectives" in f["TRC007"].title


def test_case5_exposed_transfers_name_the_implementation(tmp_path: Path) -> None:
    f = _findings(analyze_trace(_tp_trace(tmp_path, 30, 30, "void vllm::cross_device_reduce_1stage<bf16, 4>")))
    assert "TRC003" in f and "TRC007" not in f
    causes = {c.cause.split(" ")[0] + " " + c.cause.split(" ")[1]: c.status for c in f["TRC003"].causes}
    assert causes["all-reduces run"] == "ruled out"  # custom all-reduce is already on: no such advice
    nccl = _findings(analyze_trace(_tp_trace(tmp_path, 31, 31, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL")))
    assert {c.cause.split(" ")[0]: c.status for c in nccl["TRC003"].causes}["all-reduces"] == "supported"


# --- case 7: capture traces ----------------------------------------------------------------------------------

def test_case7_synthetic_capture_trace(tmp_path: Path) -> None:
    evs: list[dict[str, Any]] = [annotation("capture_32_FULL", 0, 50_000),
                                 _pyframe("vllm/v1/worker/gpu_model_runner.py(5362): capture_model", -10, 50_100)]
    for i in range(40):  # launches recorded into the graph: only a few kernels actually run
        evs.append(launch("cudaLaunchKernel", 100.0 * i, 5, i + 1))
    evs += [kernel("fill", 10.0, 2, 1), kernel("fill", 40_000.0, 2, 30)]
    a = analyze_trace(write_trace(tmp_path / "capture.json", evs))
    f = _findings(a)
    assert "TRC009" in f and "graph-capture trace, not serving" in f["TRC009"].title
    assert not {"TRC001", "TRC002"} & set(f)
    assert any("graph-capture trace" in w for w in a.warnings)


def test_case7_real_vllm_capture_trace() -> None:
    """The real vLLM capture trace (python_function events other than the capture frames removed)."""
    a = analyze_trace(DATA / "mi300x_vllm_decode_fullgraph_capture_rank0_no_python.json.gz")
    assert a.tables["trace_capture"]["rank"].tolist() == [0]
    f = _findings(a)
    assert set(f) == {"TRC009"}  # old code: error "GPU idle 100% of the trace, 100% of it waiting for the CPU"


# --- case 8: multi-rank ties and a delayed rank --------------------------------------------------------------

def _ranks(tmp_path: Path, delay_us: float) -> Path:
    doc = json.loads(gzip.decompress((DATA / "sampled_128rank" / "sampled_128rank_rank0.json.gz").read_bytes()))
    d = tmp_path / f"ranks_{int(delay_us)}"
    d.mkdir()
    for r in (0, 1, 2):
        evs = [dict(e, ts=e["ts"] + (delay_us if r == 2 else 0.0)) if isinstance(e.get("ts"), (int, float)) else e
               for e in doc["traceEvents"]]
        out = dict(doc, traceEvents=evs, distributedInfo=dict(doc["distributedInfo"], rank=r))
        (d / f"rank{r}.json").write_text(json.dumps(out))
    return d


def test_case8_identical_ranks_tie(tmp_path: Path) -> None:
    a = analyze_trace(_ranks(tmp_path, 0.0))
    coll = a.tables["trace_collectives"]
    assert len(coll) >= 10 and (coll["last_rank"] == -1).all()  # old code: rank 0 "last" at every collective
    assert _sig(a)["trace_straggler_last_share_ratio"] == 0.0
    assert "TRC008" not in _findings(a)


def test_case8_delayed_rank_is_named(tmp_path: Path) -> None:
    a = analyze_trace(_ranks(tmp_path, 500.0))
    s = _sig(a)
    assert s["trace_straggler_rank"] == 2 and s["trace_straggler_last_share_ratio"] == 1.0
    f = _findings(a)
    assert "TRC008" in f and f["TRC008"].title.startswith("Rank 2 starts 100% of")  # old code: no finding


def _late_rank(tmp_path: Path, slow: str) -> Path:
    """Three ranks of 40 steps (a GEMM, then an all-reduce); rank 2 reaches every all-reduce ~500 µs late,
    either with its GPU idle before it (``slow="host"``: its launches came late) or busy (``"gpu"``: its GEMM
    runs 1.3 ms instead of 0.8)."""
    d = tmp_path / f"late_{slow}"
    d.mkdir()
    for r in (0, 1, 2):
        evs = []
        for i in range(40):
            t0 = 10_000 + i * 3000.0
            comp = 1300.0 if (slow == "gpu" and r == 2) else 800.0
            gap = 500.0 if (slow == "host" and r == 2) else 10.0
            evs += [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": t0,
                     "dur": comp, "args": {"device": 0, "stream": 7, "correlation": 2 * i + 1}},
                    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
                     "tid": 7, "ts": t0 + comp + gap, "dur": 200.0,
                     "args": {"device": 0, "stream": 7, "correlation": 2 * i + 2}}]
        doc = {"traceEvents": evs, "distributedInfo": {"rank": r, "world_size": 3, "backend": "nccl"}}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize(("slow", "host", "gpu"), [("host", "supported", "ruled out"),
                                                    ("gpu", "ruled out", "supported")])
def test_case8_the_stragglers_cause_is_told_by_its_gpu_idle_before_the_collective(tmp_path: Path, slow: str,
                                                                                   host: str, gpu: str) -> None:
    """The straggler rule named a host cause it had no evidence for (only a host probe could support it, and
    nothing refuted it): the GPU idle of the late rank just before each collective, beyond the others', now
    tells a late launch (idle) from longer GPU work (busy up to the collective)."""
    a = analyze_trace(_late_rank(tmp_path, slow))
    s = _sig(a)
    assert s["trace_straggler_rank"] == 2 and s["trace_straggler_lag_p50_us"] == pytest.approx(500, abs=15)
    assert s["trace_straggler_idle_share_ratio"] == pytest.approx(1.0 if slow == "host" else 0.0, abs=0.05)
    f = _findings(a)["TRC008"]
    status = {c.cause.split(" ")[0]: c.status for c in f.causes}
    assert status == {"host-side": host, "a": gpu}, status
