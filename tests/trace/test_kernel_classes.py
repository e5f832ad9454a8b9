"""Issue 35 item 4: kernel classes of real kernel names (as Kineto / roctracer write them, demangled or mangled),
one table. Spellings are taken from the libraries' sources and public traces: SageAttention, FlashInfer, aiter
(AMD), Triton fused MoE, Marlin / MXFP4, CUTLASS grouped GEMMs, and the common ones around them."""

from __future__ import annotations

import pytest

from diagnose.trace.classify import kernel_class

TABLE: list[tuple[str, str]] = [
    # SageAttention: CUDA (csrc/qattn) and Triton kernels; the sage_fwd / sage_quant_kernel
    ("sage_fwd", "attention"),
    ("sage_quant_kernel", "attention"),
    ("void qk_int8_sv_f8_accum_f32_attn_inst_buf_kernel<128, 64, 64, 128>(int8_t*, int8_t*, __nv_fp8_e4m3*)",
     "attention"),
    ("quant_per_block_int8_kernel", "attention"),
    ("_attn_fwd", "attention"),
    # FlashInfer: attention, and its sampling / norm / activation kernels that must not read as attention
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<true, (flashinfer::PosEncodingMode)0, 2u, 4u, 8u>",
     "attention"),
    ("BatchPrefillWithRaggedKVCacheKernel", "attention"),
    ("void flashinfer::MergeStatesKernel<8u, 16u, 8u, 4u, __nv_bfloat16, __nv_bfloat16>", "attention"),
    ("_ZN10flashinfer8sampling30TopKTopPSamplingFromProbKernelILj1024ELN3cub18BlockScanAlgorithmE2E", "sampling"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)2>", "sampling"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*)",
     "norm_elementwise"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(__nv_bfloat16*)", "norm_elementwise"),
    # aiter (AMD)
    ("_ZN5aiter33paged_attention_ll4mi_QKV_mfma16_kernelI13__hip_bfloat16EEvv", "attention"),
    ("aiter::fmha_fwd_hd128_bf16_causal_group", "attention"),
    ("fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_32x256", "gemm"),
    ("ck_moe_stage1<ck_tile::bf16_t, 256>", "gemm"),
    ("void aiter::rmsnorm2d_fwd_kernel<ck_tile::bf16_t>", "norm_elementwise"),
    ("void aiter::cross_device_reduce_1stage<__hip_bfloat16, 8>(aiter::RankData*)", "communication"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1_SN_LDSB1", "gemm"),
    # Triton fused MoE, Marlin, MXFP4
    ("fused_moe_kernel", "gemm"),
    ("fused_moe_kernel_gptq_awq", "gemm"),
    ("void marlin_moe_wna16::Marlin<__nv_bfloat16, 4, 8, 8, 8, 4, 256, 1, true>(int4 const*)", "gemm"),
    ("void marlin::Marlin<256, 1, 8, 8, 4, 8>(int4 const*, int4 const*, int4*, int4 const*)", "gemm"),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1_swiglu", "gemm"),
    ("bmm_E2m1_E2m1E2m1_Fp32_t128x8x512u2_s3_et128x8_m128x8x64_cga1x1x1_16dp256b_TN", "gemm"),
    # CUTLASS grouped GEMMs (vLLM cutlass_moe_mm, DeepGEMM)
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple>>>",
     "gemm"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 128u>(float*, int*)", "gemm"),
    # and FlashAttention-3 built on CUTLASS stays attention
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cutlass::bfloat16_t>>>",
     "attention"),
    # the usual ones
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "gemm"),
    ("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*)", "norm_elementwise"),
    ("Memcpy HtoD (Pageable -> Device)", "memory"),
]


@pytest.mark.parametrize(("name", "cls"), TABLE, ids=[n[:40] for n, _ in TABLE])
def test_kernel_class(name: str, cls: str) -> None:
    assert kernel_class(name) == cls


@pytest.mark.parametrize("name", ["void at::native::vectorized_elementwise_kernel<4, usage_counter>",
                                  "message_passing_kernel"])
def test_sage_needs_a_word_boundary(name: str) -> None:
    assert kernel_class(name) != "attention"
