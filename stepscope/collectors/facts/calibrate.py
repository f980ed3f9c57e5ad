"""Measure this host's peak: matmul FLOP/s and a stream-like memory bandwidth.

Why measure instead of a table: a CPU's matmul peak depends on its vector units
(AVX2, AVX-512, AMX), the BLAS torch was built with, the dtype and the thread count,
and a cloud VM's bandwidth on its neighbours; no datasheet gives the figure a job can
reach. So ``stepscope calibrate`` measures it once per host, dtype and thread count
(a few seconds) and caches it (``store/calibration.py``); ratios of a job's achieved
FLOP/s and bytes/s to it then carry its date and conditions.

Method: square matmuls sized so the three operands fit the last-level cache (the
BLAS then runs from cache: the compute peak, not memory) and shrunk where one would
not fit the time budget (slow dtypes), one warm-up, then the best
of the repeats that fit the time budget; bandwidth as in McCalpin's STREAM (copy
``a = b``, triad ``a = b + s*c``) over arrays much larger than the cache (shrunk,
never below 64 MiB, where they would not fit the time budget), best of the repeats. Best, not mean: the peak is what the hardware can do, and every slower repeat
was slowed by something else (another process, a page fault, a frequency step).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from stepscope.store.calibration import Calibration, host_name

#: Default wall budget of one calibration, seconds ("a few seconds in all", issue 14).
DEFAULT_SECONDS = 3.0
#: Share of the budget for the matmul; the rest goes to copy and triad, half each.
MATMUL_SHARE = 0.6
#: Repeats timed at least (after the warm-up), however small the budget: best-of-3 is
#: the fewest that shrugs off one interrupted repeat.
MIN_REPEATS = 3
MAX_REPEATS = 50
#: Last-level cache assumed where sysfs does not say (a common laptop/VM L3 size).
DEFAULT_LLC_BYTES = 8 * 1024 * 1024
#: Bandwidth arrays: at least 4x the LLC and at least 64 MiB each, so they stream from
#: DRAM (STREAM's rule: each array >= 4x the sum of the caches).
MIN_STREAM_BYTES = 64 * 1024 * 1024
MATMUL_MIN_N, MATMUL_MAX_N, MATMUL_STEP = 256, 2048, 128

Progress = Callable[[str], None]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere)."""
    try:
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip() or "unknown CPU"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def last_level_cache_bytes() -> int:
    """The largest cache of cpu0 per sysfs (Linux), else ``DEFAULT_LLC_BYTES``."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best = 0
    for size_file in base.glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or DEFAULT_LLC_BYTES


def matmul_size(itemsize: int, llc_bytes: int) -> int:
    """n such that A, B and C (n x n each) fit the LLC, a multiple of 128, in [256, 2048]."""
    n = int((llc_bytes / (3 * itemsize)) ** 0.5)
    n = (n // MATMUL_STEP) * MATMUL_STEP
    return max(MATMUL_MIN_N, min(MATMUL_MAX_N, n))


def _best_time(
    fn: Callable[[], Any], budget_s: float, repeats: int = MIN_REPEATS
) -> tuple[float, int]:
    """Warm up once, then time ``fn`` until the budget is spent (at least ``repeats``
    times); returns (best seconds, repeats)."""
    fn()
    best = float("inf")
    done = 0
    start = time.perf_counter()
    while done < MAX_REPEATS and (done < repeats or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        done += 1
    return max(best, 1e-9), done


def _matmul_gflops(torch: Any, dtype: Any, n_cache: int, budget_s: float) -> tuple[float, int, int]:
    """Best-of-repeats GFLOP/s of an n x n matmul (2*n^3 FLOPs), the repeats, and n.

    n is the cache-sized ``n_cache`` unless one matmul would not fit the budget
    MIN_REPEATS + 1 times (warm-up included): bf16 on a CPU without bf16 units runs at
    ~1 GFLOP/s, where a 1152^2 matmul takes 3 s. A 256^2 probe gives the rate to size n.
    """

    def operands(n: int) -> tuple[Any, Any, Any]:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        return a, b, torch.empty(n, n, dtype=dtype)

    with torch.inference_mode():
        a, b, c = operands(MATMUL_MIN_N)
        probe_s, _ = _best_time(lambda: torch.mm(a, b, out=c), 0.0, repeats=1)
        rate = 2.0 * MATMUL_MIN_N**3 / probe_s  # FLOP/s, a rough first figure
        per_call = budget_s / (MIN_REPEATS + 1)
        n_budget = int((rate * per_call / 2.0) ** (1 / 3))
        n = max(MATMUL_MIN_N, min(n_cache, (n_budget // MATMUL_STEP) * MATMUL_STEP))
        a, b, c = operands(n)
        best_s, repeats = _best_time(lambda: torch.mm(a, b, out=c), budget_s)
    return 2.0 * n**3 / best_s / 1e9, repeats, n


def _stream_size(torch: Any, nbytes: int, budget_s: float) -> int:
    """``nbytes`` per array, unless MIN_REPEATS + 1 copies of that size would not fit the
    budget: then the size that does (never below MIN_STREAM_BYTES). A VM may report its
    host's whole L3 (480 MB seen), whose 4x would take seconds per copy and 6 GB of RAM.
    A 64 MiB probe copy gives the rate."""
    count = MIN_STREAM_BYTES // 4
    x = torch.empty(count, dtype=torch.float32)
    y = torch.ones(count, dtype=torch.float32)
    with torch.inference_mode():
        probe_s, _ = _best_time(lambda: x.copy_(y), 0.0, repeats=1)
    per_call = budget_s / (MIN_REPEATS + 1)
    fits = int(MIN_STREAM_BYTES * per_call / probe_s)
    return max(MIN_STREAM_BYTES, min(nbytes, fits))


def _stream_gbs(torch: Any, nbytes: int, budget_s: float) -> tuple[float, float]:
    """Copy and triad GB/s over float32 arrays of ``nbytes`` each (bandwidth does not
    depend on the dtype), bytes counted as STREAM does: 2 arrays for copy, 3 for triad."""
    count = nbytes // 4
    x = torch.empty(count, dtype=torch.float32)
    y = torch.ones(count, dtype=torch.float32)
    z = torch.full((count,), 2.0, dtype=torch.float32)
    with torch.inference_mode():
        copy_s, _ = _best_time(lambda: x.copy_(y), budget_s)
        triad_s, _ = _best_time(lambda: torch.add(y, z, alpha=3.0, out=x), budget_s)
    size = count * x.element_size()
    return 2 * size / copy_s / 1e9, 3 * size / triad_s / 1e9


def calibrate(
    dtype: str = "float32",
    threads: int | None = None,
    seconds: float = DEFAULT_SECONDS,
    *,
    progress: Progress | None = None,
    stream_bytes: int | None = None,
) -> Calibration:
    """Measure matmul FLOP/s at ``dtype`` on ``threads`` torch threads (None: torch's
    current setting, i.e. what a job would get) and copy/triad bandwidth, in about
    ``seconds``. The thread setting is restored afterwards."""
    # local: torch only when measuring; the CLI's parser and the cache readers stay light
    import torch

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise ValueError(f"calibrate: {dtype!r} is not a torch floating-point dtype")
    say = progress or (lambda _msg: None)
    began = time.perf_counter()
    before = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"calibrate: threads must be >= 1, not {threads}")
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        llc = last_level_cache_bytes()
        itemsize = torch.empty((), dtype=torch_dtype).element_size()
        n_cache = matmul_size(itemsize, llc)
        say(f"matmul {dtype} (up to {n_cache}x{n_cache}) on {used_threads} thread(s)")
        gflops, repeats, n = _matmul_gflops(torch, torch_dtype, n_cache, seconds * MATMUL_SHARE)
        stream_s = seconds * (1 - MATMUL_SHARE) / 2
        nbytes = stream_bytes or _stream_size(torch, max(MIN_STREAM_BYTES, 4 * llc), stream_s)
        say(f"stream copy and triad over 3 x {nbytes / 2**20:.0f} MiB")
        copy_gbs, triad_gbs = _stream_gbs(torch, nbytes, stream_s)
    finally:
        torch.set_num_threads(before)
    return Calibration(
        matmul_gflops=round(gflops, 3),
        copy_gbs=round(copy_gbs, 3),
        triad_gbs=round(triad_gbs, 3),
        dtype=dtype,
        threads=used_threads,
        host=host_name(),
        cpu_model=cpu_model(),
        torch_version=str(torch.__version__),
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        matmul_size=n,
        stream_mib=round(nbytes / 2**20, 1),
        seconds=round(time.perf_counter() - began, 3),
        repeats=repeats,
    )


__all__ = ["DEFAULT_SECONDS", "calibrate", "cpu_model", "last_level_cache_bytes", "matmul_size"]
