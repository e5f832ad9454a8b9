"""GEMMs bound by memory or compute (issue 35): FLOPs and bytes moved from the operators' recorded shapes,
checked against AMD TraceLens's own GEMM table for the same H100 trace (an independent implementation), and
the bound judged against the device the trace names (B200: two memory-bound GEMMs, a decode-like 1-row
logits GEMM and a narrow 128-column one; H100 prefill GEMMs: compute-bound)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagnose.trace import gemm
from diagnose.trace.classify import classify_kernels
from diagnose.trace.multirank import reduce_rank
from diagnose.trace.parse import read_trace
from diagnose.trace.signals import trace_signals

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
H100 = DATA / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"
B200 = DATA / "b200_8rank_nccl_eager.json.gz"
ORACLE = DATA / "h100_single_gpu_qwen1.5_0.5b_chat_tracelens_GEMM.csv"


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    return reduce_rank(read_trace(H100)).tables["gemm"]


def test_flops_bytes_and_rates_match_tracelens(h100: pd.DataFrame) -> None:
    rows = list(csv.DictReader(ORACLE.open(encoding="utf-8")))
    assert len(rows) == 5
    for r in rows:
        m, n, k = int(r["param: M"]), int(r["param: N"]), int(r["param: K"])
        got = h100[(h100["op"] == r["name"]) & (h100["m"] == m) & (h100["n"] == n) & (h100["k"] == k)]
        assert len(got) == 1, (r["name"], m, n, k, h100[["op", "m", "n", "k"]])
        g = got.iloc[0]
        assert g["count"] == int(r["name_count"])
        assert g["gflops"] == pytest.approx(float(r["GFLOPS_first"]), rel=1e-6)
        assert g["mbytes"] == pytest.approx(float(r["Data Moved (MB)_first"]), rel=1e-6)
        assert g["flops_per_byte"] == pytest.approx(float(r["FLOPS/Byte_first"]), rel=1e-6)
        # TraceLens averages each call's rate, this the whole time: the same within 1%
        assert g["tbps"] == pytest.approx(float(r["TB/s_mean"]), rel=0.01)
        assert g["tflops"] == pytest.approx(float(r["TFLOPS/s_mean"]), rel=0.01)
        assert g["kernel_us"] / g["count"] == pytest.approx(float(r["Kernel Time (µs)_mean"]), rel=0.01)


def test_prefill_gemms_on_an_h100_are_compute_bound_and_fp32_is_not_judged(h100: pd.DataFrame) -> None:
    bf16 = h100[h100["dtype"] == "c10::BFloat16"]
    assert len(bf16) == 4 and set(bf16["bound"]) == {"compute"}
    assert bf16["ridge_flops_per_byte"].iloc[0] == pytest.approx(989 / 3.35, rel=1e-6)
    assert set(h100.loc[h100["dtype"] == "float", "bound"]) == {""}  # TF32 allowed or not: unknown


def test_a_b200s_narrow_and_one_row_gemms_are_memory_bound_and_counted_so_in_the_step() -> None:
    r = reduce_rank(read_trace(B200))
    g = r.tables["gemm"].set_index(["m", "n", "k"])
    assert g.loc[(1, 25136, 2880), "bound"] == "memory" and g.loc[(888, 128, 2880), "bound"] == "memory"
    assert g.loc[(888, 640, 2880), "bound"] == "compute" and g.loc[(888, 2880, 512), "bound"] == "compute"
    assert g.loc[(1, 25136, 2880), "flops_per_byte"] == pytest.approx(1.0, abs=0.01)  # reads the weight once
    sig = {s.name: s.value for s in trace_signals({"trace_gemm": r.tables["gemm"],
                                                    "trace_kernel_classes": r.tables["classes"]})}
    mem_us = g.loc[g["bound"] == "memory", "kernel_us"].sum()
    assert sig["trace_gemm_memory_bound_ratio"] == pytest.approx(mem_us / g["kernel_us"].sum())
    moved = float((g.loc[g["bound"] == "memory", "mbytes"] * 2**20 * g.loc[g["bound"] == "memory", "count"]).sum())
    assert sig["trace_gemm_memory_bw_util_ratio"] == pytest.approx(moved / (mem_us / 1e6) / 8e12)
    assert 0 < sig["trace_gemm_shaped_ratio"] <= 1
    # the step's memory-bound time holds those GEMM kernels besides the memory-bound classes
    rt = read_trace(B200)
    cls = classify_kernels(rt.gpu)
    mask = gemm.memory_bound_gemms(rt.cpu_ops, rt.gpu, rt.runtime, cls.to_numpy() == "gemm", "NVIDIA B200")
    assert mask.sum() == int(g.loc[g["bound"] == "memory", "kernels"].sum())
    assert np.all(cls.to_numpy()[mask] == "gemm")
    st = r.tables["steps"].iloc[0]  # one step holds every kernel of this trace
    by_class = sum(st[f"{c}_us"] for c in ("memory", "norm_elementwise", "attention", "sampling"))
    assert st["memory_bound_us"] - by_class == pytest.approx(rt.gpu["dur_us"].to_numpy()[mask].sum(), rel=1e-4)
    assert rt.gpu["dur_us"].to_numpy()[mask].sum() > 0
    unknown = gemm.memory_bound_gemms(rt.cpu_ops, rt.gpu, rt.runtime, cls.to_numpy() == "gemm", "")
    assert not unknown.any()  # no device named: nothing judged


def test_devices_and_shapes() -> None:
    assert gemm.device_peaks("NVIDIA H100 80GB HBM3") == (3.35e12, 989e12)
    assert gemm.device_peaks("NVIDIA H100 PCIe") == (2.0e12, 756e12)
    assert gemm.device_peaks("AMD Instinct MI300X VF") == (5.3e12, 1307e12)
    assert gemm.device_peaks("AMD Radeon Graphics") is None
    # bmm and baddbmm carry a batch; addmm's bias adds its elements and one FLOP per output
    assert gemm._work("aten::bmm", ([[4, 8, 16], [4, 16, 32]], ["c10::Half", "c10::Half"])) == (
        (4, 8, 32, 16), "c10::Half", 2.0 * 4 * 8 * 32 * 16, float(2 * (4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32)))
    w = gemm._work("aten::addmm", ([[32], [8, 16], [16, 32]], ["c10::BFloat16"] * 3))
    assert w is not None and w[2] == 2.0 * 8 * 32 * 16 + 8 * 32 and w[3] == float(2 * (8 * 16 + 16 * 32 + 8 * 32 + 32))
    assert gemm._work("aten::mm", ([[8]], ["float", "float"])) is None  # a shape it does not have: skipped
    assert gemm._work("aten::mm", ([[8, 16], [16, 4]], ["c10::ComplexFloat"] * 2)) is None
