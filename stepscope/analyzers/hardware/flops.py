"""FLOPs and bytes of each CPU operator, from the shapes a capture records.

A capture made with ``record_shapes=True`` writes each operator's argument shapes
("Input Dims"), dtypes ("Input type") and, since torch 2.1, its scalar and list
arguments ("Concrete Inputs"). ``Trace.events`` does not keep these args (loading
stays fast for every other analysis), so ``operator_flops`` re-reads the op events of
each rank's file with the loader's own reader and conversions: its ``rank, tid, ts,
name`` are exactly those of the same event in ``Trace.events``.

Counting each operation once: operators nest (``aten::linear`` -> ``aten::addmm``;
``aten::conv2d`` -> ``aten::convolution`` -> ``aten::_convolution`` -> backend op;
``aten::relu_`` -> ``aten::clamp_min_``). On each thread the outermost operator with a
formula is counted and everything inside it is skipped. The formulas sit where torch's
``FlopCounterMode`` counts (mm/addmm/bmm/baddbmm, convolution, convolution_backward,
the sdpa kernels); the composites above (linear, matmul, conv2d,
scaled_dot_product_attention) have none, so their children count, as in
``FlopCounterMode`` after decomposition. An op whose shapes do not determine its count
is left out, never guessed, and so are its children; ``ops.attrs["skipped"]`` counts
them per name.

Formulas (from the shapes; the tests check them against ``torch.utils.flop_counter``):
- mm/addmm: 2*M*N*K; bmm/baddbmm: 2*B*M*N*K (the added term is not counted, as torch).
- convolution: 2 * N * S * C_out * (C_in/groups) * prod(kernel), S the output spatial
  size (the input's for a transposed conv); bias not counted. The output shape comes
  from "Concrete Inputs" (stride, padding, dilation), else from the conv's autograd
  node (same "Sequence number"), whose input is the gradient of the output.
- convolution_backward: the forward count for grad_input, plus 2*N*S*C_in*C_out*
  prod(kernel) for grad_weight (torch ignores groups there; we match it), per the
  requested grads (output_mask; on old traces without it, the backend's child ops
  ``*_backward_input``/``*_backward_weight`` say which ran; with neither, both).
- sdpa forward: 2*B*H*S_q*S_k*(D_qk + D_v) (= 4*B*H*S_q*S_k*D); backward
  2*B*H*S_q*S_k*(3*D_qk + 2*D_v) (= 10*B*H*S_q*S_k*D), causal masks ignored, as torch.
- elementwise: one FLOP per output element (the broadcast of the tensor operands).
- normalisation (batch/layer/group/instance/RMS norm): ``NORM_FLOPS_PER_ELEMENT`` per
  activation element forward, ``NORM_BACKWARD_FLOPS_PER_ELEMENT`` backward; softmax
  ``SOFTMAX_FLOPS_PER_ELEMENT`` (forward and backward).
- copy_/fill_/zero_: no FLOPs, only bytes.
Bytes: each tensor operand read once plus the output written once (elements x dtype
size from "Input type"; the output has the first operand's dtype): the minimum traffic,
ignoring caches and re-reads. An in-place op reads and writes its self.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# The loader's own conversions, so ts/tid match Trace.events exactly.
from stepscope.analyzers.trace.columns import stable_ids, us_to_ns
from stepscope.analyzers.trace.load import Trace, read_json

#: Bytes per element of each "Input type" torch writes (c10's dtype names); other types
#: ('Scalar', 'Int', 'GenericList', ...) are not tensors.
DTYPE_BYTES: dict[str, int] = {
    **dict.fromkeys(["c10::complex<double>"], 16),
    **dict.fromkeys(["double", "long int", "c10::complex<float>"], 8),
    **dict.fromkeys(["float", "int", "c10::complex<c10::Half>"], 4),
    **dict.fromkeys(["c10::Half", "c10::BFloat16", "short int"], 2),
    **dict.fromkeys(["signed char", "unsigned char", "bool", "c10::Float8_e4m3fn"], 1),
    **dict.fromkeys(["c10::Float8_e5m2", "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"], 1),
}
#: Forward normalisation per element: mean (1), variance (2), normalise (2), scale and
#: shift (2): the 7 that DeepSpeed's and Paddle's flops profilers use for layer_norm.
NORM_FLOPS_PER_ELEMENT = 7
#: Backward normalisation: twice the forward, the usual backward/forward ratio.
NORM_BACKWARD_FLOPS_PER_ELEMENT = 14
#: Softmax per element: max, subtract, exp, sum, divide (our count, one each).
SOFTMAX_FLOPS_PER_ELEMENT = 5

COLUMNS = ["rank", "step", "tid", "name", "ts", "dur_ns", "self_ns"]
COLUMNS += ["flops", "bytes", "dtype", "basis"]
_OP_CATS = ("cpu_op", "Operator", "operator")  # current and tb-profiler era names


@dataclass
class OpCall:
    """One operator event as a formula sees it (shapes and args from its trace args)."""

    name: str
    dims: list
    types: list
    concrete: list | None
    children: list[str]
    out_dims: list[int] | None = None  # the conv's output shape from its autograd node

    def tensors(self) -> list[tuple[list[int], int, str]]:
        """(shape, bytes per element, dtype) of each tensor operand; scalars and lists
        are not tensors (their type is 'Scalar', 'Int', 'GenericList', ...)."""
        out = []
        for d, t in zip(self.dims, self.types, strict=False):
            if t in DTYPE_BYTES and isinstance(d, list) and all(isinstance(x, int) for x in d):
                out.append((d, DTYPE_BYTES[t], t))
        return out

    def read(self) -> int:
        return sum(prod(s) * b for s, b, _ in self.tensors())

    def size(self) -> int:
        """Bytes per element of the output: the first tensor operand's dtype."""
        return self.tensors()[0][1]

    def arg(self, i: int, default: Any = None) -> Any:
        """The i-th concrete argument ('[2, 2]', 'False', '2' -> Python values)."""
        if not self.concrete or i >= len(self.concrete) or self.concrete[i] in ("", None):
            return default
        try:
            return ast.literal_eval(str(self.concrete[i]))
        except (ValueError, SyntaxError):
            return default


Formula = Callable[[OpCall], tuple[int, int] | None]


def _mm(op: OpCall, first: int = 0) -> tuple[int, int]:
    (m, k), (k2, n) = op.dims[first], op.dims[first + 1]
    if k != k2:
        raise ValueError("inner dimensions differ")
    return 2 * m * n * k, op.read() + m * n * op.size()


def _bmm(op: OpCall, first: int = 0) -> tuple[int, int]:
    (b, m, k), (b2, k2, n) = op.dims[first], op.dims[first + 1]
    if k != k2 or b != b2:
        raise ValueError("batch or inner dimensions differ")
    return 2 * b * m * n * k, op.read() + b * m * n * op.size()


def _listed(value: Any, n: int) -> list[int]:
    return list(value) * (n if len(value) == 1 else 1) if isinstance(value, list) else [value] * n


def _conv_out(op: OpCall, x: list[int], w: list[int], transposed: bool) -> list[int] | None:
    """The output shape: from stride/padding/dilation when recorded, else the node's."""
    stride = op.arg(3)
    if stride is None:
        return op.out_dims
    n = len(x) - 2
    s, p, d = _listed(stride, n), _listed(op.arg(4, [0]), n), _listed(op.arg(5, [1]), n)
    k, groups = w[2:], op.arg(8, 1)
    if transposed:
        extra = _listed(op.arg(7, [0]), n)
        sp = [
            (i - 1) * s[j] - 2 * p[j] + d[j] * (k[j] - 1) + extra[j] + 1
            for j, i in enumerate(x[2:])
        ]
        return [x[0], w[1] * groups, *sp]
    sp = [(i + 2 * p[j] - d[j] * (k[j] - 1) - 1) // s[j] + 1 for j, i in enumerate(x[2:])]
    return [x[0], w[0], *sp]


def _conv(op: OpCall) -> tuple[int, int] | None:
    x, w = op.dims[0], op.dims[1]
    transposed = bool(op.arg(6, False))
    out = _conv_out(op, x, w, transposed)
    if not out:
        return None
    spatial = prod(x[2:]) if transposed else prod(out[2:])
    flops = 2 * x[0] * spatial * w[0] * w[1] * prod(w[2:])
    return flops, op.read() + prod(out) * op.size()


def _conv_backward(op: OpCall) -> tuple[int, int]:
    if op.name == "aten::convolution_backward":  # (grad_out, input, weight, ...)
        go, x, w = op.dims[0], op.dims[1], op.dims[2]
        transposed, mask = bool(op.arg(7, False)), op.arg(10)
    else:  # old backend ops, e.g. aten::cudnn_convolution_backward(input, grad_out, weight)
        x, go, w = op.dims[0], op.dims[1], op.dims[2]
        transposed, mask = False, op.arg(len(op.dims) - 1)
    if not isinstance(mask, list):
        kids = op.children
        by_kids = [any(c.endswith(s) for c in kids) for s in ("_input", "_weight", "_bias")]
        mask = by_kids if any(by_kids) else [True, True, False]
    spatial = prod(x[2:]) if transposed else prod(go[2:])
    per_pair = 2 * x[0] * spatial * prod(w[2:])
    flops = mask[0] * per_pair * w[0] * w[1] + mask[1] * per_pair * x[1] * go[1]
    written = mask[0] * prod(x) + mask[1] * prod(w) + (len(mask) > 2 and mask[2]) * go[1]
    return flops, op.read() + written * op.size()


def _sdpa(op: OpCall) -> tuple[int, int]:
    (b, h, sq, dqk), (_, _, sk, _), (_, _, _, dv) = op.dims[0], op.dims[1], op.dims[2]
    return 2 * b * h * sq * sk * (dqk + dv), op.read() + b * h * sq * dv * op.size()


def _sdpa_backward(op: OpCall) -> tuple[int, int]:
    q, k, v = op.dims[1], op.dims[2], op.dims[3]
    b, h, sq, dqk = q
    sk, dv = k[2], v[3]
    written = prod(q) + prod(k) + prod(v)
    return 2 * b * h * sq * sk * (3 * dqk + 2 * dv), op.read() + written * op.size()


def _elementwise(op: OpCall) -> tuple[int, int]:
    out = prod(np.broadcast_shapes(*(tuple(s) for s, _, _ in op.tensors())))
    return out, op.read() + out * op.size()


def _per_element(flops_per_element: int) -> Formula:
    def formula(op: OpCall) -> tuple[int, int]:
        n = prod(op.tensors()[0][0])
        return n * flops_per_element, op.read() + n * op.size()

    return formula


def _moved(op: OpCall) -> tuple[int, int]:
    return 0, op.read()


_words = str.split  # a word list, one per name
_ELEMENTWISE = _words("""add sub rsub mul div neg abs exp log sqrt rsqrt pow reciprocal relu gelu
silu sigmoid tanh hardtanh leaky_relu elu clamp clamp_min clamp_max threshold where
maximum minimum addcmul addcdiv lerp masked_fill sign floor ceil round eq ne lt le gt ge
threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward
hardtanh_backward""")
_NORMS = _words("""batch_norm native_batch_norm _native_batch_norm_legit cudnn_batch_norm
_batch_norm_impl_index layer_norm native_layer_norm group_norm native_group_norm
instance_norm rms_norm _fused_rms_norm""")
_NORM_BACKWARDS = _words("""native_batch_norm_backward cudnn_batch_norm_backward
native_layer_norm_backward native_group_norm_backward _fused_rms_norm_backward""")
_SOFTMAX = ["softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data"]
_SOFTMAX += ["_log_softmax_backward_data"]
_SDPA = [f"_scaled_dot_product_{k}_attention" for k in ("flash", "efficient", "cudnn")]
_SDPA += ["_scaled_dot_product_flash_attention_for_cpu"]

#: name -> (basis, formula): the operators that have a FLOP/byte formula.
FORMULAS: dict[str, tuple[str, Formula]] = {
    "aten::mm": ("mm", _mm),
    "aten::addmm": ("mm", lambda op: _mm(op, 1)),
    "aten::bmm": ("bmm", _bmm),
    "aten::baddbmm": ("bmm", lambda op: _bmm(op, 1)),
    "aten::convolution": ("conv", _conv),
    "aten::_convolution": ("conv", _conv),
    "aten::convolution_backward": ("conv_backward", _conv_backward),
    "aten::cudnn_convolution_backward": ("conv_backward", _conv_backward),
    "aten::copy_": ("copy", _moved),
    "aten::fill_": ("fill", _moved),
    "aten::zero_": ("fill", _moved),
}
FORMULAS.update({f"aten::{n}": ("sdpa", _sdpa) for n in _SDPA})
FORMULAS.update({f"aten::{n}_backward": ("sdpa_backward", _sdpa_backward) for n in _SDPA})
for _n in _ELEMENTWISE:
    FORMULAS[f"aten::{_n}"] = FORMULAS[f"aten::{_n}_"] = ("elementwise", _elementwise)
FORMULAS.update({f"aten::{n}": ("norm", _per_element(NORM_FLOPS_PER_ELEMENT)) for n in _NORMS})
_norm_bwd = _per_element(NORM_BACKWARD_FLOPS_PER_ELEMENT)
FORMULAS.update({f"aten::{n}": ("norm_backward", _norm_bwd) for n in _NORM_BACKWARDS})
_softmax = _per_element(SOFTMAX_FLOPS_PER_ELEMENT)
FORMULAS.update({f"aten::{n}": ("softmax", _softmax) for n in _SOFTMAX})


def op_flops(op: OpCall) -> tuple[int, int, str] | None:
    """(flops, bytes, basis) of one operator call; None without a formula or shapes."""
    entry = FORMULAS.get(op.name)
    if entry is None or not isinstance(op.dims, list) or not op.tensors():
        return None
    basis, formula = entry
    try:
        got = formula(op)
    except (ValueError, IndexError, TypeError):  # shapes not of the formula's form
        return None
    return None if got is None else (int(got[0]), int(got[1]), basis)


# -- the trace -------------------------------------------------------------------------


def _op_events(path: Path) -> list[dict]:
    doc = read_json(path)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [
        e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _OP_CATS
    ]


def _conv_outputs(ops: list[dict]) -> dict[int, list[int]]:
    """Sequence number -> output shape, from conv autograd nodes (their input is the
    output's gradient), for traces that recorded no stride/padding."""
    out: dict[int, list[int]] = {}
    for e in ops:
        name, args = e.get("name", ""), e.get("args") or {}
        if "Convolution" in name and "Backward" in name and not name.startswith("autograd::"):
            dims, seq = args.get("Input Dims"), args.get("Sequence number")
            if isinstance(seq, int) and dims and isinstance(dims[0], list) and dims[0]:
                out[seq] = dims[0]
    return out


def _rank_rows(path: Path, rank: int, skipped: Counter) -> list[tuple]:
    ops = _op_events(path)
    n = len(ops)
    ts = us_to_ns([e.get("ts", 0) for e in ops])
    dur = np.maximum(us_to_ns([e.get("dur", 0) for e in ops]), 0)
    tid = stable_ids([e.get("tid", -1) for e in ops])
    pid = stable_ids([e.get("pid", -1) for e in ops])
    order = np.lexsort((-dur, ts, tid, pid)).tolist()
    covered = [False] * n  # counted, or inside a counted op
    counted = [False] * n
    children: dict[int, list[int]] = defaultdict(list)
    stack: list[int] = []
    prev_thread = None
    for i in order:
        thread = (pid[i], tid[i])
        if thread != prev_thread:
            stack, prev_thread = [], thread
        while stack and ts[stack[-1]] + dur[stack[-1]] <= ts[i]:
            stack.pop()
        p = stack[-1] if stack else -1
        if p >= 0:
            children[p].append(i)
        counted[i] = ops[i].get("name") in FORMULAS and not (p >= 0 and covered[p])
        covered[i] = counted[i] or (p >= 0 and covered[p])
        stack.append(i)
    conv_out = _conv_outputs(ops)
    rows = []
    for i in np.flatnonzero(counted).tolist():
        e, args = ops[i], ops[i].get("args") or {}
        kids = children.get(i, [])
        call = OpCall(
            name=e["name"],
            dims=args.get("Input Dims"),
            types=args.get("Input type") or [],
            concrete=args.get("Concrete Inputs"),
            children=[ops[k].get("name", "") for k in kids],
            out_dims=conv_out.get(args.get("Sequence number", -1)),
        )
        got = op_flops(call)
        if got is None:
            skipped[call.name] += 1
            continue
        self_ns = int(dur[i]) - sum(int(dur[k]) for k in kids)
        dtype = call.tensors()[0][2]
        key = (rank, -1, int(tid[i]), call.name, int(ts[i]), int(dur[i]), max(self_ns, 0))
        rows.append((*key, *got[:2], dtype, got[2]))
    return rows


def _assign_steps(ops: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The ProfilerStep each op starts in; -1 outside every step."""
    out = np.full(len(ops), -1, dtype=np.int64)
    for rank, st in steps.groupby("rank"):
        st = st.sort_values("start")
        rows = np.flatnonzero(ops["rank"].to_numpy() == rank)
        ts = ops["ts"].to_numpy()[rows]
        j = np.searchsorted(st["start"].to_numpy(), ts, side="right") - 1
        ok = (j >= 0) & (ts < st["end"].to_numpy()[np.maximum(j, 0)])
        out[rows[ok]] = st["step"].to_numpy()[j[ok]]
    return out


def operator_flops(trace: Trace) -> pd.DataFrame:
    """One row per counted CPU operator event: ``rank, step, tid, name, ts, dur_ns,
    self_ns, flops, bytes, dtype, basis`` (times in ns, as ``Trace.events``).

    Reads each rank's file again (see the module docstring for why and for the
    counting rules); ``step`` is -1 outside every ProfilerStep; ``self_ns`` is the
    duration minus the direct child operators'. ``.attrs["skipped"]`` maps names
    with a formula but no usable shapes (e.g. no ``record_shapes``) to their count.
    """
    skipped: Counter = Counter()
    rows = []
    for rank in trace.ranks:
        rows.extend(_rank_rows(Path(trace.meta[rank]["path"]), rank, skipped))
    ops = pd.DataFrame(rows, columns=COLUMNS)
    ops = ops.astype({"rank": "int16", "flops": "int64", "bytes": "int64"})
    ops["step"] = _assign_steps(ops, trace.steps)
    ops = ops.sort_values(["rank", "ts"], ignore_index=True)
    ops.attrs["skipped"] = dict(skipped)
    return ops


def flops_summary(ops: pd.DataFrame) -> pd.DataFrame:
    """Per operator name: count, flops, bytes, total and self time (ns), and FLOPs per
    byte (the arithmetic intensity a roofline places it by); most FLOPs first."""
    g = ops.groupby("name", observed=True)
    out = g.agg(
        basis=("basis", "first"),
        count=("flops", "size"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
        dur_ns=("dur_ns", "sum"),
        self_ns=("self_ns", "sum"),
    )
    out["flops_per_byte"] = out["flops"] / out["bytes"].where(out["bytes"] > 0)
    return out.sort_values(["flops", "bytes"], ascending=False).reset_index()


def flops_per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """FLOPs and bytes of each (rank, step): what MFU divides by the step's time."""
    sums = {"ops": ("flops", "size"), "flops": ("flops", "sum"), "bytes": ("bytes", "sum")}
    return ops.groupby(["rank", "step"], observed=True).agg(**sums).reset_index()
