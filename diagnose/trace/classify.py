"""Kernel and runtime-call classes by name (CUDA and ROCm spellings). Applied to unique names only."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

# Order matters: the first class whose pattern matches wins.
_KERNEL_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(
        r"nccl|rccl|hccl|msccl|cross_device_reduce|custom_?all_?reduce|allreduce|all_reduce|allgather|"
        r"all_gather|reduce_scatter|reducescatter|alltoall|all_to_all|one_shot|two_shot|quickreduce|"
        r"mscclpp|deep_?ep|nvshmem|symm_mem")),
    ("memory", re.compile(r"^(hip)?memcpy|^(hip)?memset|^dma")),
    # FlashInfer's non-attention kernels (flashinfer::sampling / norm / activation, also mangled:
    # _ZN10flashinfer8sampling...) before its attention ones
    ("sampling", re.compile(r"flashinfer\W{0,4}\d*sampling")),
    ("norm_elementwise", re.compile(r"flashinfer\W{0,4}\d*(?:norm|activation|pos_enc|rope|quantization)")),
    # MoE expert GEMMs before attention (aiter's fmoe_* / ck_moe_*, Triton fused_moe, Marlin MoE)
    ("gemm", re.compile(r"fmoe_|ck_moe|fused_moe|moe_?gemm|moe_?mlp|marlin")),
    ("attention", re.compile(
        r"flash|fmha|attention|attn|paged_?attention|sdpa|xformers|mha_|_mha|mla_|flashinfer|"
        r"reshape_and_cache|unified_attention|context_attention|decode_attention|ck_tile.*fmha|"
        # SageAttention (sage_fwd, sage_quant_kernel, its CUDA qk_int8_sv_f8_* and Triton quant_per_block_int8),
        # FlashInfer kernels named without their namespace (BatchPrefillWithPagedKVCacheKernel, MergeStates)
        r"(?:^|[^a-z])sage|qk_int8_sv_|quant_per_block_int8|per_warp_int8|kvcachekernel|batch(?:prefill|decode)with|"
        r"mergestates?")),
    ("gemm", re.compile(
        r"gemm|cutlass|xmma|cublas|hipblaslt|cijk_|nvjet|matmul|_mm_|splitk|wgmma|wmma|"
        r"sgemm|hgemm|bmm|tensorop|scaled_mm|marlin|moe_align|fused_moe|grouped_mm|triton_.*mm")),
    ("sampling", re.compile(
        r"sampl|topk|top_k|top_p|argmax|multinomial|softmax.*(?:sample|gumbel)|radix_?sort|"
        r"sort|cumsum|exponential|penalt|logits")),
    ("norm_elementwise", re.compile(
        r"norm|elementwise|act_and_mul|silu|gelu|swiglu|rotary|rope|reduce|copy|fill|cat|index|"
        r"softmax|vectorized|unrolled|triton_|where|mul|add|embedding|activation|scatter|gather|cast|"
        r"convert|transpose|permute|clamp|pow|exp|neg|scale")),
)
COMPUTE_CLASSES = ("gemm", "attention", "norm_elementwise", "sampling", "other")
KERNEL_CLASSES = ("gemm", "attention", "norm_elementwise", "sampling", "communication", "memory", "other")

SYNC_CALLS = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|"
                        r"StreamWaitEvent|CtxSynchronize)|^cu(Ctx|Stream|Event)Synchronize")
HOST_SYNC_CALLS = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize)|"
                             r"^cu(Ctx|Stream|Event)Synchronize")
SYNC_COPY_CALLS = re.compile(r"^(cuda|hip)Memcpy(?!.*Async)|^(cuda|hip)Memset(?!.*Async)|^cuMemcpy(?!.*Async)")
LAUNCH_CALLS = re.compile(r"LaunchKernel|LaunchCooperativeKernel|ModuleLaunchKernel|GraphLaunch|"
                          r"^cuLaunch|^cudaLaunch|^hipLaunch|^hipExtLaunch")
GRAPH_LAUNCH = re.compile(r"GraphLaunch")


def kernel_class(name: str, kind: str = "kernel") -> str:
    if kind in ("memcpy", "memset"):
        return "memory"
    low = name[:320].lower()  # the class shows early in a name; mangled template tails are long
    for cls, pat in _KERNEL_CLASSES:
        if pat.search(low):
            return cls
    return "other"


def classify_kernels(gpu: pd.DataFrame) -> pd.Series:
    """A categorical Series of kernel classes, computed once per unique name."""
    if gpu.empty:
        return pd.Series(pd.Categorical([], categories=KERNEL_CLASSES), index=gpu.index)
    names = gpu["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    per_name = np.array([kernel_class(str(n)) for n in names.cat.categories] + ["other"], dtype=object)
    codes = names.cat.codes.to_numpy()
    out = per_name[np.where(codes < 0, len(per_name) - 1, codes)]
    out = np.where(gpu["kind"].astype(str).to_numpy() != "kernel", "memory", out)
    return pd.Series(pd.Categorical(out, categories=KERNEL_CLASSES), index=gpu.index)


def is_comm(cls: pd.Series) -> pd.Series:
    return cls == "communication"


def memcpy_direction(name: str) -> str:
    """'HtoD', 'DtoH', 'DtoD', 'PtoP', 'HtoH' from a Kineto memcpy activity name; 'memset' or '?'."""
    if name.lower().startswith("memset"):
        return "memset"
    m = re.search(r"(HtoD|DtoH|DtoD|PtoP|HtoH|DtoA|AtoD)", name)
    return m.group(1) if m else "?"


def is_pageable(name: str) -> bool:
    return "Pageable" in name
