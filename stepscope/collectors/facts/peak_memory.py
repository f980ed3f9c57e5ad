"""The job's peak memory, read in the job at its exit: what an experiment compares
when a fix is for memory (``optimize --goal memory``).

The system sampler's RSS samples (``proc.rss_bytes``) are one a second and miss a peak
that lasts a backward pass; the kernel keeps the process's true high-water mark
(``ru_maxrss``), and torch's CUDA allocator keeps its own (``max_memory_allocated``,
``max_memory_reserved``). CUDA is read only where the job initialised it: a CPU-only job
never touches CUDA from here. On Linux the peak address space (``VmPeak``) is read too:
it is what ``--memory-limit`` (RLIMIT_AS) caps, so the largest batch under a limit is
predicted from it (``optim_runner/sweeps/largest_batch.py``), not from the RSS.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any


def peak_memory() -> dict[str, Any]:
    """``{"rss_bytes": ..., "vm_peak_bytes": ..., "cuda_allocated_bytes": ...,
    "cuda_reserved_bytes": ...}``, each present only where it could be read."""
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes
        out["rss_bytes"] = float(maxrss if sys.platform == "darwin" else maxrss * 1024)
    with contextlib.suppress(Exception), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPeak:"):  # "VmPeak:  2345678 kB"
                out["vm_peak_bytes"] = float(int(line.split()[1]) * 1024)
                break
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):
        if torch is not None and torch.cuda.is_initialized():
            out["cuda_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
            out["cuda_reserved_bytes"] = float(torch.cuda.max_memory_reserved())
    return out


__all__ = ["peak_memory"]
