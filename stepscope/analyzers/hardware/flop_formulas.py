"""FLOPs and bytes of one operator call, from its recorded shapes: the formulas.

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
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from stepscope.analyzers.trace import flop_ops

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
FORMULAS.update({f"aten::{n}": ("sdpa", _sdpa) for n in flop_ops.SDPA_OPS})
FORMULAS.update(
    {f"aten::{n}_backward": ("sdpa_backward", _sdpa_backward) for n in flop_ops.SDPA_OPS}
)
for _n in flop_ops.ELEMENTWISE_OPS:
    FORMULAS[f"aten::{_n}"] = FORMULAS[f"aten::{_n}_"] = ("elementwise", _elementwise)
_norm, _norm_bwd = map(_per_element, (NORM_FLOPS_PER_ELEMENT, NORM_BACKWARD_FLOPS_PER_ELEMENT))
FORMULAS.update({f"aten::{n}": ("norm", _norm) for n in flop_ops.NORM_OPS})
FORMULAS.update({f"aten::{n}": ("norm_backward", _norm_bwd) for n in flop_ops.NORM_BACKWARD_OPS})
_softmax = _per_element(SOFTMAX_FLOPS_PER_ELEMENT)
FORMULAS.update({f"aten::{n}": ("softmax", _softmax) for n in flop_ops.SOFTMAX_OPS})


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
