"""The diagnosis's thresholds: each a named constant with the rule it comes from.

They were checked on the examples in ``examples/`` and the real traces in
``../shared/traces`` (see tests/test_diagnosis.py); the rules (``rules_*``) compare
the evidence against them.
"""

from __future__ import annotations

# I/O: torch-tb-profiler flags DataLoader > 5 % of the step; XProf calls a job
# "moderately input-bound" from 5 % and "highly input-bound" from 20 %.
INPUT_MIN = 0.05
INPUT_HIGH = 0.20
# Storage: sustained iowait above 10 % of CPU time is the usual iostat/sar sign of a
# disk-bound reader (Brendan Gregg's USE method treats it as disk saturation).
IOWAIT_HIGH = 10.0  # percent
# GPU utilisation below 50 % is torch-tb-profiler's "low GPU utilisation" rule.
GPU_UTIL_LOW = 0.50
GPU_UTIL_BUSY = 0.80
# Host overhead worth a finding: 10 % of the step (the smallest share a launch-bound
# trace shows in Nsight Systems' "GPU starvation" analysis is of this order).
HOST_MIN = 0.10
# Compute and memory-bandwidth findings: their kernels (or CPU ops) take >= 10 % of
# the step. Below that, speeding them up cannot matter.
KERNEL_MIN = 0.10
# Optimizer step: a fused or foreach step over a model's parameters costs a few % of a
# training step (nanoGPT's GPT-2 124M on an A100: fused AdamW ~1 % of the step);
# 15 % means the per-parameter loop, many small tensors or a tiny batch. Measured here:
# AdamW's per-parameter loop on an 8.4 M-parameter MLP was 37 % of the CPU step.
OPTIMIZER_MIN = 0.15
# Productive work can be sped up at most ~2x by the catalog's fixes: cost = share / 2.
PRODUCTIVE_WEIGHT = 0.5
# Tensor Cores: tb-profiler flags GEMM/conv-heavy runs whose kernels use 0 % Tensor
# Cores; we use < 5 % of kernel time, on kernels from Volta (sm70) on.
TENSOR_CORE_MIN = 0.05
# Communication: tb-profiler flags > 10 %; from 5 % it is reported with less confidence.
COMM_MIN = 0.05
COMM_HIGH = 0.10
# Host-device copies and syncs: 5 % of the step.
HOST_DEVICE_MIN = 0.05
# Capacity: tb-profiler warns at peak memory > 90 % of the device; fragmentation when
# reserved is 1.5x allocated (PyTorch's memory docs on caching-allocator fragmentation).
CAPACITY_HIGH = 0.90
FRAGMENTATION_RATIO = 1.5
# Samples only: a CPU job whose process tree uses less than half a core on average
# is waiting, not computing; one that keeps a core 80 % busy (95th percentile, so
# that the start-up of an attached job does not hide it) is computing.
WAITING_CPU_PERCENT = 50.0
COMPUTING_CPU_PERCENT = 80.0
# Inference (``rules.inference``): a job with forward steps and no optimizer and no
# backward. Most of its forward steps (half or more) recorded by autograd, or run with
# the model in training mode, make a finding: one stray call (a warm-up under grad)
# does not.
INFERENCE_MODE_MIN = 0.5
# Recording the graph is waste, not work, and its fix is free (automatic, the same
# outputs): it ranks at the forward's full share, as waiting does, so it comes before the
# compute findings of the same forward (PRODUCTIVE_WEIGHT). Without a trace the part of
# the forward autograd's bookkeeping takes cannot be told from the work; and every other
# fix of the forward (compile, bf16, int8) measured on a forward that records gradients
# is measured against the wrong baseline. The gain shown is the fix's own Amdahl bound
# (``fixes/catalog/inference_mode.py``: its typical range), not this weight.
INFERENCE_GRAD_WEIGHT = 1.0
# A batch of one sample: every per-call cost (Python, dispatch, launches, weights read
# from memory for one row) is paid per sample; a larger batch removes up to 70 % of
# the step there (``fixes/catalog/larger_batch.py``'s removes).
SMALL_BATCH_MAX = 1.0
SMALL_BATCH_WEIGHT = 0.7
# Generation (``rules.generation``): a run whose steps are requests.
# No KV cache: the decode forwards' own times fit against the context length they
# computed over (Theil-Sen over the per-position medians, so that one request slowed by a
# neighbour does not bend the line). With a cache a decode step computes one new token
# (its cost nearly flat in the context: attention over the cache is a small part of it
# until the context is several times the model's width); without one it recomputes the
# whole context, so its cost grows in proportion. A finding needs a trend over at least
# 8 positions, the position explaining half the variance of the medians (r^2), and the
# fit's last position 1.5x its first: a cached GPT-2 decode on this project's CPU stays
# within noise of flat (growth ~1.0x), a nanoGPT-style loop over 2..100 tokens of context
# grows 5-10x.
NO_CACHE_MIN_POSITIONS = 8
NO_CACHE_MIN_R2 = 0.5
NO_CACHE_MIN_GROWTH = 1.5
# Recomputing the context is waste, not work: the time a cache gives back can all go
# (its share is that time, from the fit), so it ranks at its full share, as waiting does.
NO_CACHE_WEIGHT = 1.0
# Decode at batch size 1: requests of one row whose decode (after what a cache would give
# back) is most of the request time. Each decode step reads every weight for one token;
# batching reads them once for the batch. Issue 22, measured by hand: 8 prompts in one
# generate() call gave 3.3x tokens/s with identical greedy tokens on a 6-layer GPT-2 on a
# CPU, i.e. 70 % of the per-token time gone: the weight ``larger_batch`` uses too.
DECODE_MIN = 0.5
DECODE_BATCH_WEIGHT = 0.7
# Decode against the roof: bytes read per decoded token over its time, as a fraction of
# the memory bandwidth (the host's STREAM triad, ``stepscope calibrate``, or the GPU's
# datasheet figure). Memory-bound kernels reach 60-80 % of STREAM bandwidth in practice
# (McCalpin's STREAM results; the roofline paper's measured ceilings), so from half of it
# on the token waits on reading the weights; far below it, on per-call overhead.
DECODE_ROOF_NEAR = 0.5
# Long prompts: the prefill (the first forward, over the whole prompt) takes 30 % of the
# request time or more. It is compute-bound work (the prompt's tokens in one batch), with
# fixes of its own (fused attention), which matter once it is a third of the request;
# below that the decode's fixes come first. Productive work: PRODUCTIVE_WEIGHT.
LONG_PREFILL_MIN = 0.3
