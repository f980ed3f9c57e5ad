"""Fewer, larger parameter tensors (advice: it changes the model's code).

An unfused optimizer step costs per parameter *tensor*, not per parameter: the
per-parameter loop launches several ops for each tensor, and even the foreach and
fused steps group tensors into chunks. A model of many small tensors (a bias beside
every Linear, separate q/k/v projections, per-head parameters) pays that per-tensor
cost every step. Merging them (one qkv projection, no bias before a normalisation)
makes the step cheaper without changing what the model can express.
"""

from __future__ import annotations

from stepscope.fixes.base import Fix

FIX = Fix(
    id="fewer_param_tensors",
    title="Fewer, larger parameter tensors (merge q/k/v, drop biases before a norm)",
    addresses=("compute/optimizer_step",),
    requires=("training",),
    changes_numerics=True,
    auto=False,
    why="the optimizer step pays per parameter tensor; merging small tensors into "
    "large ones leaves the same arithmetic in fewer, longer operations",
    snippet="self.qkv = nn.Linear(d, 3 * d, bias=False)  # one tensor instead of three\n"
    "q, k, v = self.qkv(x).split(d, dim=-1)\n"
    "nn.Linear(d, h, bias=False)  # when a LayerNorm/BatchNorm follows: its shift is the bias",
    removes=0.5,
    phases=("optimizer",),
    target="the model's parameters",
)
