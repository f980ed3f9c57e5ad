"""FLOPs and bytes per operator: equal to torch's own counts on real CPU captures.

Each test records a small capture of known shapes with the profiler
(``record_shapes=True``), loads it with stepscope's loader and compares the counts with
``torch.utils.flop_counter.FlopCounterMode`` run on the same calls (exact equality for
matmul, conv and attention), and on the shared ResNet-50 trace with the known count.
On every shared trace the result is pinned to that of the per-event implementation
that re-read each file (before the loader kept the op args, ``Trace.op_args``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from traces import (
    A100,
    ALL,
    CPU_ONLY,
    MI250,
    RANK0,
    RANK1,
    RESNET_NW0,
    RESNET_NW4,
    V100_NS,
    trace_path,
)

from stepscope.analyzers.hardware.flop_formulas import FORMULAS, NORM_FLOPS_PER_ELEMENT
from stepscope.analyzers.hardware.flops import flops_per_step, flops_summary, operator_flops
from stepscope.analyzers.trace import flop_ops
from stepscope.analyzers.trace.load import Trace, load_trace
from stepscope.store import bounded_read

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _capture(tmp_path: Path, fn: Callable[[], None], shapes: bool = True) -> pd.DataFrame:
    from torch.profiler import ProfilerActivity, profile

    # with_flops makes the profiler record shapes too, so it goes with them
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=shapes, with_flops=shapes
    ) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    ops = operator_flops(load_trace(path))
    ops.attrs["profiler_events"] = [(e.name, e.flops) for e in prof.events()]
    ops.attrs["trace"] = load_trace(path)
    return ops


def _torch_counts(fn: Callable[[], None]) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}


def _by_basis(ops: pd.DataFrame) -> dict[str, int]:
    return {k: int(v) for k, v in ops.groupby("basis")["flops"].sum().items()}


def _assert_counted_once(ops: pd.DataFrame) -> None:
    """No counted op lies inside another on its thread, and each is a Trace.events row."""
    for _, g in ops.groupby(["rank", "tid"]):
        g = g.sort_values("ts")
        ends = (g["ts"] + g["dur_ns"]).to_numpy()
        assert (g["ts"].to_numpy()[1:] >= ends[:-1]).all()
    ev = ops.attrs.get("trace")
    if ev is not None:
        keys = ev.events[["rank", "tid", "ts", "name"]].astype({"name": str})
        joined = ops[["rank", "tid", "ts", "name"]].merge(keys, how="left", indicator=True)
        assert (joined["_merge"] == "both").all()


def test_matmul_family_equals_flop_counter_and_profiler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    x3, y3 = torch.randn(4, 5, 7), torch.randn(4, 7, 3)
    bias, w = torch.randn(3), torch.randn(3, 7)

    def run() -> None:
        torch.mm(a, b)
        torch.addmm(torch.randn(5, 3), a, b)
        torch.bmm(x3, y3)
        torch.baddbmm(torch.randn(4, 5, 3), x3, y3)
        torch.matmul(a, b)
        torch.matmul(x3, y3)
        torch.matmul(x3, b)  # folded into one mm
        F.linear(a, w, bias)
        F.linear(x3, w)

    ops = _capture(tmp_path, run)
    ref = _torch_counts(run)
    got = _by_basis(ops)
    assert got["mm"] == ref["aten.mm"] + ref["aten.addmm"]
    assert got["bmm"] == ref["aten.bmm"] + ref["aten.baddbmm"]
    assert got["mm"] == 2 * 5 * 7 * 3 * 4 + 2 * 20 * 7 * 3 * 2  # mm, addmm, matmul, linear
    profiler = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
    prof_total = sum(f or 0 for n, f in ops.attrs["profiler_events"] if n in profiler)
    assert prof_total == got["mm"] + got["bmm"]
    assert set(ops["name"]) <= profiler  # linear/matmul are counted through their children
    mm = ops[ops["name"] == "aten::mm"].iloc[0]
    assert mm["bytes"] == (5 * 7 + 7 * 3 + 5 * 3) * 4 and mm["dtype"] == "float"
    _assert_counted_once(ops)


CONVS = [  # (conv function, input shape, weight shape, keyword arguments)
    (F.conv1d, (2, 4, 16), (6, 4, 3), {"padding": 1}),
    (F.conv2d, (2, 4, 10, 10), (6, 2, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
    (F.conv2d, (1, 3, 9, 9), (8, 3, 5, 5), {"dilation": 2}),
    (F.conv3d, (1, 2, 6, 6, 6), (4, 2, 3, 3, 3), {"stride": (1, 2, 2)}),
    (F.conv_transpose2d, (1, 4, 5, 5), (4, 3, 3, 3), {"stride": 2, "output_padding": 1}),
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("input_grad", [True, False])
def test_conv_forward_and_backward_equal_flop_counter(
    tmp_path: Path, with_bias: bool, input_grad: bool
) -> None:
    torch.manual_seed(0)
    cases = []
    for fn, xs, ws, kw in CONVS:
        x = torch.randn(xs, requires_grad=input_grad)
        w = torch.randn(ws, requires_grad=True)
        out_ch = ws[1] * kw.get("groups", 1) if fn is F.conv_transpose2d else ws[0]
        bias = torch.randn(out_ch, requires_grad=True) if with_bias else None
        cases.append((fn, x, w, bias, kw))

    def run() -> None:
        for fn, x, w, bias, kw in cases:
            fn(x, w, bias, **kw).sum().backward()

    ops = _capture(tmp_path, run)
    ref = _torch_counts(run)
    got = _by_basis(ops)
    assert got["conv"] == ref["aten.convolution"]
    assert got["conv_backward"] == ref["aten.convolution_backward"]
    assert (ops["basis"] == "conv").sum() == len(CONVS)
    assert (ops["basis"] == "conv_backward").sum() == len(CONVS)
    assert not ops["name"].isin(["aten::conv2d", "aten::_convolution"]).any()
    grouped = ops[ops["basis"] == "conv"].iloc[1]  # conv2d, 2x4x10x10 -> 2x6x5x5
    assert grouped["flops"] == 2 * (2 * 6 * 5 * 5) * (4 // 2) * 3 * 3
    bias_bytes = 6 * 4 if with_bias else 0
    assert grouped["bytes"] == (2 * 4 * 10 * 10 + 6 * 2 * 3 * 3 + 2 * 6 * 5 * 5) * 4 + bias_bytes
    assert ops.attrs["skipped"] == {}
    _assert_counted_once(ops)


def test_attention_forward_and_backward_equal_torch(tmp_path: Path) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    torch.manual_seed(0)
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    k = torch.randn(2, 4, 12, 16, requires_grad=True)
    v = torch.randn(2, 4, 12, 16, requires_grad=True)

    def run() -> None:  # equal head sizes: the CPU flash kernel runs
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    ops = _capture(tmp_path, run)
    got = _by_basis(ops)
    # FlopCounterMode has no entry for the CPU flash kernel (it counts 0 for it), so
    # the reference is torch's own sdpa formulas on the same shapes.
    assert got["sdpa"] == sdpa_flop_count(q.shape, k.shape, v.shape) == 4 * 2 * 4 * 8 * 12 * 16
    assert got["sdpa_backward"] == sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
    assert got["sdpa_backward"] == 10 * 2 * 4 * 8 * 12 * 16
    assert set(ops.loc[ops["basis"] == "sdpa", "name"]) == {
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    }
    _assert_counted_once(ops)
    k = torch.randn(2, 2, 12, 16, requires_grad=True)  # grouped-query: 2 kv heads
    v = torch.randn(2, 2, 12, 32, requires_grad=True)  # and a larger value head

    def run_math() -> None:  # the math backend decomposes into bmm: FlopCounterMode counts
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()

    ops = _capture(tmp_path, run_math)
    ref = _torch_counts(run_math)
    got = _by_basis(ops)
    assert "sdpa" not in got
    assert got.get("bmm", 0) + got.get("mm", 0) == sum(ref.values()) > 0
    _assert_counted_once(ops)


def test_elementwise_and_norm_by_elements_and_dtype(tmp_path: Path) -> None:
    x, y = torch.randn(3, 4), torch.randn(4)
    h = torch.randn(6, 5, dtype=torch.bfloat16)
    t = torch.randn(4, 8)

    def run() -> None:
        x + y  # broadcast: 12 outputs
        h.relu_()
        F.layer_norm(t, (8,))

    ops = _capture(tmp_path, run).set_index("name")
    assert ops.loc["aten::add", "flops"] == 12
    assert ops.loc["aten::add", "bytes"] == (12 + 4 + 12) * 4
    assert ops.loc["aten::relu_", "flops"] == 30
    assert ops.loc["aten::relu_", "bytes"] == 2 * 30 * 2
    assert ops.loc["aten::relu_", "dtype"] == "c10::BFloat16"
    assert ops.loc["aten::layer_norm", "flops"] == 32 * NORM_FLOPS_PER_ELEMENT
    assert "aten::native_layer_norm" not in ops.index  # counted once, at the outer op
    assert "aten::clamp_min_" not in ops.index


def test_without_shapes_nothing_is_guessed(tmp_path: Path) -> None:
    a = torch.randn(5, 7)
    ops = _capture(tmp_path, lambda: torch.mm(a, a.t()), shapes=False)
    assert ops.empty
    assert ops.attrs["skipped"] == {"aten::mm": 1}


def test_resnet50_conv_flops_per_step() -> None:
    """ResNet-50 has 4.1 G multiply-accumulates per 224x224 image in its convolutions;
    training does the forward once and the backward's two convolutions (grad input,
    grad weight) about twice as much: ~3 x 4.1 G MACs x 2 FLOPs per MAC x batch."""
    trace = load_trace(trace_path(RESNET_NW0))
    ops = operator_flops(trace)
    assert ops.attrs["skipped"] == {}
    _assert_counted_once(ops)
    conv = ops[ops["basis"].isin(["conv", "conv_backward"])]
    first_conv = conv[conv["basis"] == "conv"].iloc[0]
    assert first_conv["name"] == "aten::convolution"
    batch = 32  # the first conv's input, [32, 3, 224, 224] in the trace's "Input Dims"
    per_step = conv.groupby("step")["flops"].sum()
    assert list(per_step.index) == [5, 6, 7, 8, 9, 10]
    assert per_step.nunique() == 1  # the same work every step
    expected = 3 * 4.1e9 * 2 * batch
    assert 0.9 * expected < per_step.iloc[0] < 1.1 * expected
    counts = conv.groupby(["step", "basis"]).size()
    assert set(counts) == {53}  # ResNet-50's 53 convolutions, forward and backward, once
    forward = conv[conv["basis"] == "conv"].groupby("step")["flops"].sum().iloc[0]
    assert 4.0e9 * 2 * batch < forward < 4.2e9 * 2 * batch
    steps = flops_per_step(ops)
    assert (steps.loc[steps["step"] >= 5, "flops"] >= per_step.iloc[0]).all()
    summary = flops_summary(ops)
    assert summary.iloc[0]["name"] == "aten::cudnn_convolution_backward"


# -- one parse, same results -------------------------------------------------------------

#: files -> (rows, sum of flops, sum of bytes, skipped events, digest), as the per-event
#: implementation that re-read each file (stepscope before Trace.op_args) gave them; the
#: digest covers the whole frame (as CSV: every row, in order) and the skipped counts.
#: Two files of one distributedInfo.rank are renumbered by position: op args follow.
PINNED = {
    (RESNET_NW0,): (7860, 4716726391038, 157410668856, 0, "c41b0910ba11c4cd"),
    (RESNET_NW4,): (7284, 4716697489662, 156977146680, 0, "cce980a88d4a06ca"),
    (A100,): (0, 0, 0, 2670, "1fb5796361ea4e13"),
    (V100_NS,): (0, 0, 0, 4450, "d0dc0a8a06896428"),
    (RANK0,): (826, 1654253228195, 51817996916, 28, "1437f0a582773949"),
    (RANK1,): (823, 1722163256474, 53030965876, 26, "655424384fe780cd"),
    (CPU_ONLY,): (0, 0, 0, 0, "28f95391d216be56"),
    (MI250,): (10, 345472, 365572, 0, "747e67b2c4e2e0e2"),
    (RANK0, RANK1): (1649, 3376416484669, 104848962792, 54, "55c17e73856cbd98"),
    (RANK1, RANK0, RANK1): (2472, 5098579741143, 157879928668, 80, "43ceba09e8e31809"),
}
OP_DTYPES = {"rank": "int16", "step": "int64", "tid": "int64", "ts": "int64"}
OP_DTYPES |= {"dur_ns": "int64", "self_ns": "int64", "flops": "int64", "bytes": "int64"}


@pytest.mark.parametrize("names", list(PINNED), ids="+".join)
def test_every_shared_trace_gives_the_pinned_operators(names: tuple[str, ...]) -> None:
    ops = operator_flops(load_trace([trace_path(n) for n in names]))
    skipped = ops.attrs["skipped"]
    got = (len(ops), int(ops["flops"].sum()), int(ops["bytes"].sum()), sum(skipped.values()))
    assert got == PINNED[names][:4]
    text = ops.to_csv(index=False) + repr(sorted(skipped.items()))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == PINNED[names][4]
    if len(ops):  # the empty frame's columns are of dtype object, as they always were
        assert {c: str(ops[c].dtype) for c in OP_DTYPES} == OP_DTYPES
        assert all(pd.api.types.is_string_dtype(ops[c]) for c in ("name", "dtype", "basis"))


def test_every_shared_trace_is_pinned() -> None:
    assert {n for names in PINNED for n in names} == set(ALL)


def test_the_loader_keeps_the_args_of_exactly_the_operators_with_a_formula() -> None:
    """trace.load names them (it sits below hardware); FORMULAS gives each a formula."""
    assert set(FORMULAS) == flop_ops.FLOP_OPERATORS
    assert all(flop_ops.keeps_op_args(n) for n in FORMULAS)
    assert flop_ops.keeps_op_args("CudnnConvolutionBackward0")  # the conv's autograd node
    assert flop_ops.keeps_op_args("ConvolutionBackward0")
    assert not flop_ops.keeps_op_args("autograd::engine::evaluate_function: ConvolutionBackward0")
    assert not flop_ops.keeps_op_args("aten::empty") and not flop_ops.keeps_op_args(7)


def test_operator_flops_parses_each_file_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Path] = []
    read_capped = bounded_read.read_capped  # every read of a trace file goes through it

    def counted(path: Path, cap: int | None = None) -> bytes | bytearray:
        reads.append(path)
        return read_capped(path, cap)

    monkeypatch.setattr(bounded_read, "read_capped", counted)
    paths = [trace_path(RANK0), trace_path(RANK1)]
    ops = operator_flops(load_trace(paths))
    assert len(ops) == PINNED[RANK0, RANK1][0]
    assert sorted(reads) == sorted(paths)


def test_a_trace_without_op_args_says_how_to_get_them() -> None:
    trace = load_trace(trace_path(MI250))
    bare = Trace(trace.events, trace.memory, trace.steps, trace.ranks, trace.meta)
    with pytest.raises(ValueError, match="load_trace"):
        operator_flops(bare)
