"""GPU metrics against torch-tb-profiler 0.4.3's overview numbers, and edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from traces import A100, CPU_ONLY, MI250, RESNET_NW0, RESNET_NW4, trace_path

from stepscope.analyzers.hardware.gpu_metrics import (
    gpu_metrics,
    sm_efficiency,
    uses_tensor_cores,
    uses_tensor_cores_modern,
)
from stepscope.analyzers.trace.load import load_trace

REFERENCE = json.loads(
    (Path(__file__).parent / "reference" / "tb_profiler_breakdown.json").read_text()
)


@pytest.mark.parametrize("name", [RESNET_NW0, RESNET_NW4])
def test_agrees_with_tb_profiler(name: str) -> None:
    ref = REFERENCE["traces"][name]["gpu"]["0"]
    row = gpu_metrics(load_trace(trace_path(name))).set_index("device").loc[0]
    assert 100 * row["gpu_utilization"] == pytest.approx(ref["gpu_utilization_percent"], abs=0.1)
    assert 100 * row["sm_efficiency"] == pytest.approx(ref["sm_efficiency_percent"], abs=0.1)
    assert row["achieved_occupancy"] == pytest.approx(ref["achieved_occupancy_percent"], abs=0.1)
    assert 100 * row["tensor_core_share"] == pytest.approx(ref["tensor_core_percent"], abs=0.1)
    assert row["name"].startswith("Tesla V100")


def test_a100_tensor_core_share_matches_tb_profiler_kernel_ratio() -> None:
    ref = REFERENCE["traces"][A100]["kernel_tensor_core_percent"]
    row = gpu_metrics(load_trace(trace_path(A100))).iloc[0]
    assert ref > 5  # cutlass tensorop s1688 / sm80 xmma kernels
    assert 100 * row["tensor_core_share"] == pytest.approx(ref, abs=0.5)


def test_cpu_only_has_no_gpu_rows() -> None:
    assert gpu_metrics(load_trace(trace_path(CPU_ONLY))).empty


def test_mi250_has_utilisation_but_no_cupti_estimates() -> None:
    g = gpu_metrics(load_trace(trace_path(MI250)))
    assert g["device"].tolist() == [2]
    assert 0 < g["gpu_utilization"].iloc[0] < 1
    assert np.isnan(g["sm_efficiency"].iloc[0]) and np.isnan(g["achieved_occupancy"].iloc[0])


def test_sm_efficiency_caps_concurrent_blocks_at_one() -> None:
    ts = np.array([0, 50], dtype=np.int64)
    end = np.array([100, 150], dtype=np.int64)
    bps = np.array([0.5, 0.75], dtype=np.float32)
    # 0..50: 0.5; 50..100: min(1.25, 1) = 1; 100..150: 0.75; 150..200: 0
    assert sm_efficiency(ts, end, bps, 0, 200) == pytest.approx((25 + 50 + 37.5) / 200)


def test_tensor_core_patterns() -> None:
    assert uses_tensor_cores(
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nt_align4>"
    )
    assert uses_tensor_cores("xmma_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc")
    # tb-profiler's list misses cuDNN 8's sm80_xmma_fprop_* names; we keep its list as is
    assert not uses_tensor_cores("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32")
    assert not uses_tensor_cores("volta_sgemm_128x64_nn")


def test_modern_tensor_core_names_the_tb_list_misses() -> None:
    """Kernel names seen on A100 (cuDNN 8) and on an H100 (torch 2.11, CUDA 13, bf16 matmul)."""
    hopper_gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    ampere_conv = "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw"
    for name in (hopper_gemm, ampere_conv):
        assert not uses_tensor_cores(name)
        assert uses_tensor_cores_modern(name)
    assert not uses_tensor_cores_modern("volta_sgemm_128x64_nn")
    assert not uses_tensor_cores_modern("void at::native::vectorized_elementwise_kernel<4>")


def test_fp32_cuda_core_gemms_are_not_tensor_core_work() -> None:
    """fp32 matmul kernels from the same H100 run: FFMA/SIMT, no Tensor Cores.

    tb-profiler's list claims the first (substring 'xmma_gemm'); the modern rule must not.
    """
    ffma = (
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_"
        "aligna4_alignc4_execute_kernel__5x_cublas"
    )
    simt = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(Params)"
    assert uses_tensor_cores(ffma)  # tb-profiler's false positive, kept for parity
    assert not uses_tensor_cores_modern(ffma)
    assert not uses_tensor_cores_modern(simt)
    tf32 = (
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_"
        "stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn"
    )
    assert uses_tensor_cores_modern(tf32)
