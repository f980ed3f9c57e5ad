"""The operators whose args the loader keeps for the FLOP counting, by name.

The loader (``load.py``) must know which operators' shapes to keep from its one parse,
and it sits below ``hardware/`` in the layers, so the names live here;
``hardware.flop_formulas.FORMULAS`` gives each of them its formula (built from these lists), and
tests/test_flops.py checks that both name the same set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_words = str.split  # a word list, one per name
#: Elementwise operators (each also in its in-place '_' form): one FLOP per output.
ELEMENTWISE_OPS = _words("""add sub rsub mul div neg abs exp log sqrt rsqrt pow reciprocal
relu gelu silu sigmoid tanh hardtanh leaky_relu elu clamp clamp_min clamp_max threshold
where maximum minimum addcmul addcdiv lerp masked_fill sign floor ceil round eq ne lt le
gt ge threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward
hardtanh_backward""")
NORM_OPS = _words("""batch_norm native_batch_norm _native_batch_norm_legit cudnn_batch_norm
_batch_norm_impl_index layer_norm native_layer_norm group_norm native_group_norm
instance_norm rms_norm _fused_rms_norm""")
NORM_BACKWARD_OPS = _words("""native_batch_norm_backward cudnn_batch_norm_backward
native_layer_norm_backward native_group_norm_backward _fused_rms_norm_backward""")
SOFTMAX_OPS = _words("""softmax _softmax log_softmax _log_softmax _softmax_backward_data
_log_softmax_backward_data""")
SDPA_OPS = [f"_scaled_dot_product_{k}_attention" for k in ("flash", "efficient", "cudnn")]
SDPA_OPS += ["_scaled_dot_product_flash_attention_for_cpu"]
#: The matmul, convolution and data-movement operators, whose formulas are one each.
OTHER_FLOP_OPS = _words("""mm addmm bmm baddbmm convolution _convolution convolution_backward
cudnn_convolution_backward copy_ fill_ zero_""")


def _aten(names: Iterable[str]) -> list[str]:
    return [f"aten::{n}" for n in names]


#: Every operator with a FLOP/byte formula (``hardware.flop_formulas.FORMULAS`` has these keys).
FLOP_OPERATORS = frozenset(
    _aten(OTHER_FLOP_OPS + SDPA_OPS + NORM_OPS + NORM_BACKWARD_OPS + SOFTMAX_OPS)
    + _aten(f"{n}_backward" for n in SDPA_OPS)
    + _aten(ELEMENTWISE_OPS)
    + _aten(f"{n}_" for n in ELEMENTWISE_OPS)
)


def is_conv_node(name: str) -> bool:
    """A convolution's autograd node ('CudnnConvolutionBackward0', ...): its first input
    is the gradient of the conv's output, whose shape old traces give nowhere else."""
    return "Convolution" in name and "Backward" in name and not name.startswith("autograd::")


def keeps_op_args(name: Any) -> bool:
    """Whether the loader keeps this operator's args in ``Trace.op_args``."""
    return name in FLOP_OPERATORS or (isinstance(name, str) and is_conv_node(name))
