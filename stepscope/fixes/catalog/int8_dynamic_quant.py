"""Dynamic int8 quantisation of the model's Linear and LSTM layers, on the CPU.

``torch.ao.quantization.quantize_dynamic`` stores those layers' weights in int8 and
quantises each activation on the fly: the GEMMs read a quarter of the bytes and run on
int8 kernels (fbgemm/x86, oneDNN), which is where a CPU inference step of Linear/LSTM
layers spends its time. Outputs change (8-bit weights), so it needs consent; the
output guard of the experiment compares them with the baseline's.

Applied to the model at its first call, before its forward starts (the layers are
replaced in place, so this first call already runs quantised). Only for inference:
quantised layers have no gradients. Dropped where torch has no quantised engine.
"""

from __future__ import annotations

import warnings
from typing import Any

from stepscope.fixes.base import Fix, Typical
from stepscope.fixes.points import Change, ModelCall


def _on_model(call: ModelCall, params: dict[str, Any]) -> None:
    torch, model = call.torch, call.inner
    nn = torch.nn
    if call.device.type != "cpu":
        call.record(Change("not applied: dynamic int8 quantisation runs on the CPU only", False))
        return
    if torch.backends.quantized.engine == "none":
        call.record(Change("not applied: this torch has no quantised CPU engine", False))
        return
    layers = {nn.Linear, nn.LSTM}
    if type(model) in layers:
        call.record(Change("not applied: the model is a single layer (replaced in place)", False))
        return
    before = sum(type(m) in layers for m in model.modules())
    if not before:
        call.record(Change("not applied: the model has no nn.Linear or nn.LSTM layer", False))
        return
    with warnings.catch_warnings():  # torch.ao's notice that it moves to torchao
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(model, layers, dtype=torch.qint8, inplace=True)
    dynamic = torch.ao.nn.quantized.dynamic
    after = sum(isinstance(m, (dynamic.Linear, dynamic.LSTM)) for m in model.modules())
    call.record(
        Change(
            f"{before} Linear/LSTM layers of {type(model).__name__} quantised to int8 "
            f"(dynamic, {torch.backends.quantized.engine})",
            verified=after == before,
        )
    )


FIX = Fix(
    id="int8_dynamic_quant",
    title="Dynamic int8 quantisation of Linear/LSTM layers (CPU)",
    addresses=("compute/device_compute",),
    requires=("cpu_only", "inference", "linear_or_lstm"),
    changes_numerics=True,
    auto=True,
    why="int8 weights are a quarter of float32's bytes and int8 GEMM kernels do more per "
    "cycle: the Linear and LSTM layers that a CPU inference step spends its time in run "
    "faster, at a small cost in accuracy",
    snippet="model = torch.ao.quantization.quantize_dynamic(\n"
    "    model, {torch.nn.Linear, torch.nn.LSTM}, dtype=torch.qint8\n)",
    typical=Typical(
        1.0,
        4.3,
        "bench/inference.py: 4.3x (95 % CI 4.0-4.6) on examples/text_classifier_int8.py "
        "(LSTM 1024 hidden, batch 8, 1 thread, x86 CPU); small layers (256 hidden) gained "
        "nothing measurable: the larger the weights, the more it gives",
    ),
    target="a CPU model with nn.Linear or nn.LSTM layers",
    on_model=_on_model,
)
