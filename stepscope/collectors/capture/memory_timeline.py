"""torch's categorised memory timeline of a capture window (parameters, activations,
gradients...), saved beside its trace: what the analysis splits a run's peak by
(``analyzers/report/run_memory.py``). ``profiler_capture`` calls it on the trace
writer's thread, once the trace is compressed.
"""

from __future__ import annotations

import os
import time
from typing import Any

#: torch's categorised memory timeline (``export_memory_timeline``) rebuilds the whole
#: event tree in Python: about 1 s per 10 k profiler events on an idle core (a 3-step
#: capture of a small transformer trainer, 12 k events, 240 KB of gzipped trace: 1.2 s
#: beside the trace's 0.12 s; 4.7 to 5.3 s on a loaded 2-core machine; an MLP's 55 KB
#: trace, 0.3 to 0.5 s). Past this many bytes of gzipped trace (~50 k events) it is
#: skipped, and said; ``STEPSCOPE_MEMORY_TIMELINE=0`` turns it off.
MEMORY_TIMELINE_MAX_TRACE_BYTES = 1 << 20
MEMORY_TIMELINE_ENV = "STEPSCOPE_MEMORY_TIMELINE"
MEMORY_TIMELINE_SUFFIX = ".memory_timeline.raw.json.gz"


def memory_timeline_wanted() -> bool:
    """False where ``STEPSCOPE_MEMORY_TIMELINE`` turns it off (0, false, no, off)."""
    return os.environ.get(MEMORY_TIMELINE_ENV, "").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def timeline_skipped(trace_path: str) -> str | None:
    """The line that says why the window's timeline is not exported (its gzipped trace
    is too big to walk), or None: it is."""
    size = os.path.getsize(trace_path)
    if size <= MEMORY_TIMELINE_MAX_TRACE_BYTES:
        return None
    return (
        f"memory timeline not saved: the trace is {size / 2**20:.1f} MiB, above "
        f"{MEMORY_TIMELINE_MAX_TRACE_BYTES / 2**20:.0f} MiB (its export would take too long)"
    )


def save_memory_timeline(prof: Any, path: str) -> dict[str, Any]:
    """The window's timeline written to ``path``; its artifact meta (device, export
    seconds). Raises what torch raises."""
    import warnings  # local: only here

    import torch  # local: the job's own torch, imported by then

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    started = time.perf_counter()
    with warnings.catch_warnings():  # its deprecation notice is not the job's
        warnings.simplefilter("ignore")
        prof.export_memory_timeline(path, device=device)
    return {"device": device, "export_s": round(time.perf_counter() - started, 3)}
