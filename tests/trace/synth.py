"""Small synthetic Kineto traces that reproduce real serving shapes the shared traces lack (issue 35), with every
figure countable by hand from the events written here.

Event shapes follow the real traces in /work/shared/traces/tracelens (vLLM V1 on MI300X, SGLang): complete ``X``
events with categories ``python_function``, ``user_annotation``, ``gpu_user_annotation``, ``cuda_runtime``,
``kernel``; a flow pair (``s`` on the launch call, ``f`` on the kernel, category ``ac2g``, id = correlation)
linking each launch to its kernel; one correlation id shared by the kernels of a graph replay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.trace.helpers import write_trace

CPU_PID = 851
GPU_PID = 0
STREAM = 7

# vLLM V1 (0.11) frame names: the worker's execute_model calls the model runner's
WORKER_FRAME = "vllm/v1/worker/gpu_worker.py(447): execute_model"
RUNNER_FRAME = "vllm/v1/worker/gpu_model_runner.py(2520): execute_model"
FORWARD_FRAME = "vllm/v1/worker/gpu_model_runner.py(2304): _model_forward"
PREFILL_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
DECODE_GEMM = "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT"
NCCL_RING = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
CUSTOM_AR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)"


def frame(name: str, ts: float, dur: float, cat: str = "python_function") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": CPU_PID, "tid": CPU_PID, "ts": ts, "dur": dur}


def runtime(name: str, ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    """A runtime call and, for a launch, the start of its flow arrow."""
    ev = {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": CPU_PID, "tid": CPU_PID, "ts": ts, "dur": dur,
          "args": {"correlation": corr, "cbid": 211}}
    return [ev, {"ph": "s", "id": corr, "pid": CPU_PID, "tid": CPU_PID, "ts": ts, "cat": "ac2g", "name": "ac2g"}]


def gpu_kernel(name: str, ts: float, dur: float, corr: int) -> list[dict[str, Any]]:
    ev = {"ph": "X", "cat": "kernel", "name": name, "pid": GPU_PID, "tid": STREAM, "ts": ts, "dur": dur,
          "args": {"device": 0, "stream": STREAM, "correlation": corr, "registers per thread": 128}}
    return [ev, {"ph": "f", "id": corr, "pid": GPU_PID, "tid": STREAM, "ts": ts, "cat": "ac2g", "name": "ac2g",
                 "bp": "e"}]


def gpu_range(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": GPU_PID, "tid": STREAM, "ts": ts,
            "dur": dur}


# --- vLLM V1, TP rank 0: nested execute_model frames -----------------------------------------------------------
# Step 0, prefill, eager (CPU 1000-2000): 20 GEMMs of 100 us back to back from 1040 (launched every 10 us from
# 1030), then an NCCL ring all-reduce of 400 us (launched at 1240, runs 3040-3440 behind the GEMMs).
# Steps 1-9, decode, one graph replay each of 5 GEMMs of 60 us and a custom all-reduce of 40 us (340 us):
# step 1 (CPU 2050-2650) launches at 2150 while the prefill still runs: its kernels queue, 3440-3780; steps
# 2-9 start at 4000 + 1000 (i - 2) and their kernels run 130-470 us after the step start.
V1_STEP_STARTS = [1000.0, 2050.0] + [4000.0 + 1000.0 * (i - 2) for i in range(2, 10)]


def nested_v1_events(*, annotation: bool = False) -> list[dict[str, Any]]:
    """The 10 steps above; each step is a worker ``execute_model`` frame (1000 us for the prefill, 600 us for a
    decode) holding the runner's (20 us in, 10 us before the end) holding ``_model_forward``; with
    ``annotation``, an ``execute_model`` user annotation 5 us around the worker frame too (and its GPU twin)."""
    evs: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": CPU_PID, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    corr = 0
    for i, t in enumerate(V1_STEP_STARTS):
        dur = 1000.0 if i == 0 else 600.0
        evs += [frame(WORKER_FRAME, t, dur), frame(RUNNER_FRAME, t + 20, dur - 30),
                frame(FORWARD_FRAME, t + 25, dur - 50)]
        if annotation:
            evs.append(frame("execute_model", t - 5, dur + 10, cat="user_annotation"))
        if i == 0:
            for k in range(20):
                corr += 1
                evs += runtime("cudaLaunchKernel", 1030 + 10 * k, 5, corr)
                evs += gpu_kernel(PREFILL_GEMM, 1040 + 100 * k, 100, corr)
            corr += 1
            evs += runtime("cudaLaunchKernel", 1240, 5, corr)
            evs += gpu_kernel(NCCL_RING, 3040, 400, corr)
            if annotation:
                evs.append(gpu_range("execute_model", 1040, 2400))
            continue
        corr += 1
        evs += runtime("cudaGraphLaunch", t + 100, 20, corr)
        g0 = 3440.0 if i == 1 else t + 130
        evs += [e for k in range(5) for e in gpu_kernel(DECODE_GEMM, g0 + 60 * k, 60, corr)]
        evs += gpu_kernel(CUSTOM_AR, g0 + 300, 40, corr)
        if annotation:
            evs.append(gpu_range("execute_model", g0, 340))
    return evs


def gpu_copy(name: str, ts: float, dur: float, corr: int, nbytes: int) -> list[dict[str, Any]]:
    ev = {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": GPU_PID, "tid": STREAM, "ts": ts, "dur": dur,
          "args": {"device": 0, "stream": STREAM, "correlation": corr, "bytes": nbytes}}
    return [ev, {"ph": "f", "id": corr, "pid": GPU_PID, "tid": STREAM, "ts": ts, "cat": "ac2g", "name": "ac2g",
                 "bp": "e"}]


def pageable_copies(n: int = 9) -> list[dict[str, Any]]:
    """``n`` cudaMemcpyAsync calls from pageable memory, one in each decode step from step 1 (at the step start +
    40 us, 8 us on the CPU), each copy 1 us on the GPU (4 KiB): n us of a 10430 us window."""
    evs: list[dict[str, Any]] = []
    for k, t in enumerate(V1_STEP_STARTS[1:1 + n]):
        corr = 10_000 + k
        evs += runtime("cudaMemcpyAsync", t + 40, 8, corr)
        evs += gpu_copy("Memcpy HtoD (Pageable -> Device)", t + 45, 1, corr, 4096)
    return evs


def write_nested_v1(path: Path, *, annotation: bool = False, pageable: int = 0) -> Path:
    evs = nested_v1_events(annotation=annotation) + (pageable_copies(pageable) if pageable else [])
    return write_trace(path, evs, gz=path.name.endswith(".gz"),
                       deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}])


# the synthetic traces of the labelled suite (tests/trace/labels/*.yaml, key ``synthetic``): name -> builder
SYNTHETIC: dict[str, Callable[[Path], Path]] = {
    "vllm_v1_nested_tp": lambda d: write_nested_v1(d / "vllm_v1_nested_tp.json"),
    "vllm_v1_nested_tp_annotated": lambda d: write_nested_v1(d / "vllm_v1_nested_tp_annotated.json",
                                                             annotation=True),
    "vllm_v1_nested_tp_pageable": lambda d: write_nested_v1(d / "vllm_v1_nested_tp_pageable.json", pageable=9),
}


# --- capture passes of other frameworks than vLLM -----------------------------------------------------------------
SGLANG_RUNNER = "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py"


def _captured_launches(t: float, corr: int, n: int, api: str = "cuda") -> tuple[list[dict[str, Any]], float, int]:
    """A stream capture from ``t``: BeginCapture, ``n`` launches recorded into the graph (no kernel runs),
    EndCapture, GraphInstantiate. Returns (events, the time after it, last correlation id)."""
    evs: list[dict[str, Any]] = []
    corr += 1
    evs += runtime(f"{api}StreamBeginCapture", t, 3, corr)[:1]
    t += 5
    for _k in range(n):
        corr += 1
        evs += runtime(f"{api}LaunchKernel", t, 4, corr)[:1]
        t += 6
    corr += 1
    evs += runtime(f"{api}StreamEndCapture", t, 7, corr)[:1]
    corr += 1
    evs += runtime(f"{api}GraphInstantiate", t + 10, 300, corr)[:1]
    return evs, t + 320, corr


SGLANG_CAPTURE_BS = (32,)


def sglang_capture_events() -> list[dict[str, Any]]:
    """SGLang's CUDA-graph capture (--enable-profile-cuda-graph) of batch size 32: a ``capture`` frame of
    cuda_graph_runner.py holding a ``capture_one_batch_size`` frame and a ``capture_32_DECODE`` annotation; in it,
    one warm-up forward of 11 kernels of 1 us run back to back, then the capture of 11 launches (no kernel runs).
    GPU: 11 kernels, 11 us, back to back (busy 100% of its 11 us window)."""
    evs: list[dict[str, Any]] = []
    corr = 0
    evs.append(frame(f"{SGLANG_RUNNER}(612): capture", 900, 4200))
    for j, bs in enumerate(SGLANG_CAPTURE_BS):
        t0 = 1000.0 + 1000.0 * j
        evs += [frame(f"{SGLANG_RUNNER}(700): capture_one_batch_size", t0, 900),
                frame(f"capture_{bs}_DECODE", t0 + 2, 890, cat="user_annotation")]
        t = t0 + 10
        for k in range(11):  # warm-up run: launched every 5 us, the kernels queue back to back
            corr += 1
            evs += runtime("cudaLaunchKernel", t + 5 * k, 4, corr)
            evs += gpu_kernel(f"void at::native::vectorized_elementwise_kernel<4, bs{bs}>", t + 10 + k, 1, corr)
        cap, _, corr = _captured_launches(t + 100, corr, 11)
        evs += cap
    return evs


def inductor_capture_events() -> list[dict[str, Any]]:
    """A torch.compile(mode="reduce-overhead") run profiled while Inductor's cudagraph trees record: ProfilerStep#1-3
    (1000 us each), each running 10 eager warm-up kernels of 10 us launched every 60 us (each starts 5 us after its
    launch call ends: the CPU paces the GPU, which idles 50 us in 60) and then recording: a ``record_function``
    frame of cudagraph_trees.py holding ``_record`` and a stream capture of 10 launches."""
    evs: list[dict[str, Any]] = []
    corr = 0
    for s in range(3):
        t0 = 1000.0 + 1000.0 * s
        evs.append(frame(f"ProfilerStep#{s + 1}", t0, 1000, cat="user_annotation"))
        for k in range(10):
            corr += 1
            evs += runtime("cudaLaunchKernel", t0 + 10 + 60 * k, 5, corr)
            evs += gpu_kernel("triton_poi_fused_add_mul_0", t0 + 20 + 60 * k, 10, corr)
        evs += [frame("torch/_inductor/cudagraph_trees.py(1120): record_function", t0 + 620, 370),
                frame("torch/_inductor/cudagraph_trees.py(1180): _record", t0 + 625, 360)]
        cap, _, corr = _captured_launches(t0 + 630, corr, 10)
        evs += cap
    return evs


SYNTHETIC["sglang_capture"] = lambda d: write_trace(d / "sglang_capture.json", sglang_capture_events())
SYNTHETIC["inductor_cudagraph_trees_capture"] = lambda d: write_trace(d / "inductor_capture.json",
                                                                     inductor_capture_events())


def inductor_record_then_replay_events() -> list[dict[str, Any]]:
    """The recording steps above, then ProfilerStep#4-8 replaying the recorded graph: one cudaGraphLaunch (20 us)
    at the step start + 10 each, its 10 kernels of 10 us back to back from 35 us in (1000 us steps)."""
    evs = inductor_capture_events()
    corr = 10_000
    for s in range(3, 8):
        t0 = 1000.0 + 1000.0 * s
        evs.append(frame(f"ProfilerStep#{s + 1}", t0, 1000, cat="user_annotation"))
        corr += 1
        evs += runtime("cudaGraphLaunch", t0 + 10, 20, corr)
        evs += [e for k in range(10) for e in gpu_kernel("triton_poi_fused_add_mul_0", t0 + 35 + 10 * k, 10, corr)]
    return evs


# --- an untraced host stall at the entry of every step's model forward ------------------------------------------
STALL_US = 3000.0
STALL_STEP_STARTS = [1000.0 + 7000.0 * i for i in range(6)]


def host_stall_events() -> list[dict[str, Any]]:
    """6 vLLM V1 steps (worker frame holding the runner's), 7000 us apart: step 0 an eager prefill (20 GEMMs of
    100 us, launched every 10 us), steps 1-5 graph decodes (one replay: 5 GEMMs of 60 us + all-reduce 40 us). Each
    step: ``_model_forward`` opens at +40; an ``aten::copy_`` op (+45 to +55) launches a 5 us input copy kernel
    (+50 to +55); then nothing is recorded for STALL_US (native code / GIL: no op, no runtime call); the forward's
    launches begin at +55 + STALL_US. The GPU idles from +55 until the forward's first kernel."""
    evs: list[dict[str, Any]] = []
    corr = 0
    for i, t in enumerate(STALL_STEP_STARTS):
        dur = STALL_US + (400.0 if i else 2500.0)
        evs += [frame(WORKER_FRAME, t, dur), frame(RUNNER_FRAME, t + 20, dur - 30),
                frame(FORWARD_FRAME, t + 40, dur - 60),
                {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": CPU_PID, "tid": CPU_PID, "ts": t + 45,
                 "dur": 10}]
        corr += 1
        evs += runtime("cudaLaunchKernel", t + 47, 4, corr)
        evs += gpu_kernel("void at::native::vectorized_elementwise_kernel<4, copy>", t + 50, 5, corr)
        f0 = t + 55 + STALL_US  # the forward's first launch
        if i == 0:
            for k in range(20):
                corr += 1
                evs += runtime("cudaLaunchKernel", f0 + 10 * k, 5, corr)
                evs += gpu_kernel(PREFILL_GEMM, f0 + 10 + 100 * k, 100, corr)
            continue
        corr += 1
        evs += runtime("cudaGraphLaunch", f0, 20, corr)
        evs += [e for k in range(5) for e in gpu_kernel(DECODE_GEMM, f0 + 25 + 60 * k, 60, corr)]
        evs += gpu_kernel(CUSTOM_AR, f0 + 325, 40, corr)
    return evs


SYNTHETIC["vllm_v1_host_stall"] = lambda d: write_trace(d / "vllm_v1_host_stall.json", host_stall_events())
