"""Kernel classes on real kernel names, top tables, and self times."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from traces import A100, CPU_ONLY, MI250, RANK0, RESNET_NW0, trace_path

from stepscope.analyzers.trace.kernels import (
    HOST_TREE_CATS,
    KERNEL_CLASSES,
    class_summary,
    classify_kernel,
    self_times,
    top_kernels,
    top_ops,
)
from stepscope.analyzers.trace.load import load_trace

REAL_NAMES = [
    # V100 (cuDNN / cuBLAS volta_*)
    ("volta_scudnn_128x64_relu_interior_nn_v1", "gemm_conv"),
    ("volta_sgemm_64x64_nt", "gemm_conv"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm_conv"),  # H100, cuBLASLt
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int)", "gemm_conv"),
    (
        "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int)",
        "gemm_conv",
    ),
    (
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd)",
        "gemm_conv",
    ),
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "gemm_conv"),
    (
        "void splitKreduce_kernel<float, float, float, float>(cublasSplitKParams<float>)",
        "gemm_conv",
    ),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct)",
        "normalization",
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float)",
        "normalization",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
        "elementwise",
    ),
    (
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>(cudnn::ops::nchw2nhwc_params_t<float>)",
        "elementwise",
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
        "reduction",
    ),
    (
        "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>(int)",
        "reduction",
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>(float*)",
        "normalization",
    ),
    # A100 (ampere_*, sm80_*, cutlass)
    ("ampere_sgemm_128x64_nn", "gemm_conv"),
    (
        "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16",
        "gemm_conv",
    ),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nt_align4>(Params)",
        "gemm_conv",
    ),
    (
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "communication",
    ),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    (
        "void at::native::(anonymous namespace)::LayerNormForwardCUDAKernel<float, float>(long)",
        "normalization",
    ),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<int>>", "reduction"),
    # MI250 (Tensile / ATen on ROCm)
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", "gemm_conv"),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<>>(int)",
        "elementwise",
    ),
]


@pytest.mark.parametrize(("name", "expected"), REAL_NAMES)
def test_classifier_on_real_kernel_names(name: str, expected: str) -> None:
    assert classify_kernel(name) == expected


def test_copies_and_sets_by_category() -> None:
    assert classify_kernel("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == "memcpy"
    assert classify_kernel("Memset (Device)", "gpu_memset") == "memset"


@pytest.mark.parametrize("name", [RESNET_NW0, A100, MI250, RANK0])
def test_most_kernel_time_is_classified(name: str) -> None:
    cls = class_summary(load_trace(trace_path(name))).set_index("class")
    assert set(cls.index) == set(KERNEL_CLASSES)
    assert cls.loc["other", "share"] < 0.1
    assert cls["share"].sum() == pytest.approx(1.0)


def test_resnet_is_conv_dominated_and_a100_has_nccl() -> None:
    resnet = class_summary(load_trace(trace_path(RESNET_NW0))).set_index("class")["share"]
    assert resnet["gemm_conv"] > 0.5 and resnet["communication"] == 0
    a100 = class_summary(load_trace(trace_path(A100))).set_index("class")["share"]
    assert a100["communication"] > 0


def test_top_kernels_table() -> None:
    top = top_kernels(load_trace(trace_path(RESNET_NW0)), n=5)
    assert len(top) == 5
    assert top["total_ns"].is_monotonic_decreasing
    assert (top["mean_ns"] <= top["max_ns"]).all()
    assert set(top["class"]) <= set(KERNEL_CLASSES)


def _brute_self(ev: pd.DataFrame) -> np.ndarray:
    """Reference: an explicit stack walk per thread."""
    out = ev["dur"].to_numpy().copy()
    df = ev.reset_index(drop=True).assign(i=np.arange(len(ev)))
    df = df[df["dur"] > 0].sort_values(
        ["rank", "pid", "tid", "ts", "dur"], ascending=[True, True, True, True, False]
    )
    stack: list[tuple[int, int]] = []
    key = None
    for i, t, e, k in zip(
        df["i"],
        df["ts"],
        df["end"],
        zip(df["rank"], df["pid"], df["tid"], strict=True),
        strict=True,
    ):
        if k != key:
            stack, key = [], k
        while stack and stack[-1][1] <= t:
            stack.pop()
        if stack:
            out[stack[-1][0]] -= max(min(e, stack[-1][1]) - t, 0)
        stack.append((i, e))
    return np.maximum(out, 0)


@pytest.mark.parametrize("name", [RESNET_NW0, A100, CPU_ONLY])
def test_self_times_equal_a_stack_walk(name: str) -> None:
    ev = load_trace(trace_path(name)).events
    host = ev[ev["cat"].isin(HOST_TREE_CATS).to_numpy()]
    np.testing.assert_array_equal(self_times(host), _brute_self(host))


def test_self_times_hand_made() -> None:
    # parent 0..100 with children 10..30 and 40..50 (grandchild 42..45), sibling 100..110
    ev = pd.DataFrame(
        {"rank": 0, "pid": 1, "tid": 1, "ts": [0, 10, 40, 42, 100], "dur": [100, 20, 10, 3, 10]}
    )
    ev["end"] = ev["ts"] + ev["dur"]
    assert self_times(ev).tolist() == [70, 20, 7, 3, 10]


def test_top_ops_by_self_time() -> None:
    ops = top_ops(load_trace(trace_path(RESNET_NW0)), n=10)
    assert len(ops) == 10 and ops["self_ns"].is_monotonic_decreasing
    assert (ops["self_ns"] <= ops["total_ns"]).all()
    assert not ops["name"].str.startswith("ProfilerStep#").any()
    # num_workers=0: the loader's own Python time is the biggest self time
    assert ops["name"].iloc[0].startswith("enumerate(DataLoader)")
