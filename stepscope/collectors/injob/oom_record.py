"""What the job's memory looked like when it ran out: recorded where it happened.

A job that dies of torch's ``OutOfMemoryError`` (CUDA) or of the CPU allocator's
RuntimeError ("can't allocate memory", what a process memory limit produces) leaves
only its traceback. The bootstrap's excepthook calls ``record_oom`` with it, and the
run's config gets one ``oom`` entry per process that ran out (appended: each rank
adds its own), with the numbers the diagnosis explains it by:

``bytes_asked`` (the failing allocation, from the message), ``rss_bytes`` and
``address_space_bytes`` (the process's resident set and mapped address space at that
moment: RLIMIT_AS caps the latter), ``limit_bytes`` (RLIMIT_AS, None if unlimited), on
CUDA ``cuda_allocated_bytes``/``cuda_reserved_bytes``/``cuda_total_bytes`` (read only
where the job initialised CUDA itself), ``step`` (the step the step timer was in,
0-based as the steps table counts), ``source`` (the last traceback frame of the user's
code: outside torch, stepscope and site-packages), ``model_state`` (the parameters,
gradients, optimizer state and buffers on that device: ``model_state.py``) and ``rank``. On CUDA a memory
snapshot is dumped when memory history was being recorded (a capture's, or the job's).

It runs in a process that just ran out of memory: every part is guarded, and a part
that fails leaves its field out and says so in the run's log; the job's exit is never
touched.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import traceback
from typing import Any

from stepscope.collectors.injob.model_state import model_state_bytes
from stepscope.errors import bytes_asked, is_out_of_memory, one_line_error

OOM_KEY = "oom"  # the run config's key: a list of records, one per process that ran out
SNAPSHOT_FILE = "oom.memory_snapshot.pickle"
# A frame from these is the library that allocated, not the user's line that asked.
# stepscope's own files by their package folder, not by a "/stepscope/" in the path: a
# job in a clone of stepscope (examples/corpus/gpt_trainer.py) is the user's code.
_NOT_USER = ("site-packages", "dist-packages", "<frozen")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/"


def is_oom(exc_type: Any, exc: Any) -> bool:
    """torch's OutOfMemoryError (by name: torch may be half-imported) or an error whose
    message says memory ran out."""
    names = {getattr(t, "__name__", "") for t in getattr(exc_type, "__mro__", ())}
    return "OutOfMemoryError" in names or is_out_of_memory(str(exc))


def record_oom(
    exc_type: Any, exc: Any, tb: Any, writer: Any, timer: Any = None, run_dir: str | None = None
) -> dict[str, Any] | None:
    """Write the OOM record of this exception (None, nothing written, if it is not one)."""
    if not is_oom(exc_type, exc):
        return None
    record: dict[str, Any] = {
        "error": one_line_error(exc_type, exc),
        "bytes_asked": bytes_asked(str(exc)),
        "rank": int(getattr(writer, "rank", 0) or 0),
        "pid": os.getpid(),
    }
    failed: list[str] = []
    for part in (_process_memory, _limit, _cuda_memory):
        try:
            record.update(part())
        except Exception as exc_part:  # one number missing costs only itself
            failed.append(f"{part.__name__.lstrip('_')}: {type(exc_part).__name__}")
    try:
        held = _model_state(timer, record)
        if held is not None:
            record["model_state"] = held
    except Exception as exc_state:
        failed.append(f"model state: {type(exc_state).__name__}")
    record["step"] = None if timer is None else int(getattr(timer, "step", 0))
    record["source"] = user_line(tb)
    try:
        snapshot, recorded = _cuda_snapshot(timer, run_dir)
        if snapshot is not None:
            if not recorded:
                writer.add_artifact("memory_snapshot", snapshot, {"reason": "oom"})
            record["snapshot"] = snapshot
    except Exception as exc_snap:
        failed.append(f"snapshot: {type(exc_snap).__name__}")
    writer.merge_run_json("config", {OOM_KEY: [record]}, appended=(OOM_KEY,))
    writer.log("error", "oom", summary(record))
    if failed:
        writer.log("warning", "oom", "OOM record incomplete: " + "; ".join(failed))
    return record


def summary(record: dict[str, Any]) -> str:
    """One line for the run's log: what was asked, what was in use, where."""
    asked = record.get("bytes_asked")
    parts = [f"out of memory asking for {asked} bytes" if asked else "out of memory"]
    if record.get("limit_bytes"):
        parts.append(f"limit {record['limit_bytes']} bytes")
    if record.get("step") is not None:
        parts.append(f"step {record['step']}")
    if record.get("source"):
        parts.append(f"at {record['source']}")
    if record.get("snapshot"):  # `stepscope memory RUN` reads it: why the request failed
        parts.append(f"allocator snapshot {os.path.basename(record['snapshot'])}")
    return ", ".join(parts)


def user_line(tb: Any) -> str | None:
    """``path:line in function: code`` of the last frame outside the libraries."""
    with contextlib.suppress(Exception):
        for frame in reversed(traceback.extract_tb(tb)):
            name = frame.filename.replace("\\", "/")
            if any(part in name for part in _NOT_USER) or _is_library(name):
                continue
            code = (frame.line or "").strip()
            return f"{frame.filename}:{frame.lineno} in {frame.name}" + (
                f": {code}" if code else ""
            )
    return None


def _is_library(path: str) -> bool:
    """A file of stepscope's package, or of torch's (wherever either is installed)."""
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(getattr(torch, "__file__", None) or "/nonexistent/") + "/"
    full = os.path.abspath(path)
    return full.startswith(_PACKAGE) or full.startswith(torch_dir)


def _process_memory() -> dict[str, Any]:
    """Resident set and address space from /proc (no psutil: the job may lack it)."""
    with open("/proc/self/statm") as f:
        size, resident = (int(x) for x in f.read().split()[:2])
    page = os.sysconf("SC_PAGE_SIZE")
    return {"rss_bytes": resident * page, "address_space_bytes": size * page}


def _limit() -> dict[str, Any]:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return {"limit_bytes": None if soft == resource.RLIM_INFINITY else int(soft)}


def _cuda_memory() -> dict[str, Any]:
    """The CUDA allocator's figures, only where the job initialised CUDA itself (a
    CPU-only job never touches CUDA here)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    index = cuda.current_device()
    return {
        "cuda_device": index,
        "cuda_allocated_bytes": int(cuda.memory_allocated(index)),
        "cuda_reserved_bytes": int(cuda.memory_reserved(index)),
        "cuda_total_bytes": int(cuda.get_device_properties(index).total_memory),
    }


def _model_state(timer: Any, record: dict[str, Any]) -> dict[str, int] | None:
    """The model's state on the device that ran out (``model_state.py``), from the
    optimizers the job made and the module its steps call; None without either."""
    torch = sys.modules.get("torch")
    state = getattr(timer, "state", None)
    if torch is None or state is None:
        return None
    forward = getattr(timer, "forward", None)
    model = forward.anchor() if forward is not None else None
    index = record.get("cuda_device")
    device = torch.device("cpu") if index is None else torch.device("cuda", int(index))
    return model_state_bytes(list(state.optimizer_refs), model, torch, device)


def _cuda_snapshot(timer: Any, run_dir: str | None) -> tuple[str | None, bool]:
    """Dump the allocator's snapshot where memory history was being recorded: (its
    path, whether its artifact row is written already); None on CPU, without a run
    folder, or without history (a snapshot of no events says nothing). Its trace ends
    with the allocator's ``oom`` entry: the request and the device's free bytes."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if run_dir is None or cuda is None or not cuda.is_initialized():
        return None, False
    capture = getattr(timer, "capture", None)
    if capture is not None and getattr(capture, "_memory_history", False):
        # the capture's own, stopped as it would be, its row marked as the error's
        return capture._dump_memory_snapshot({"reason": "oom"}), True
    snapshot = cuda.memory._snapshot()
    if not any(snapshot.get("device_traces") or []):
        return None, False
    path = os.path.join(run_dir, SNAPSHOT_FILE)
    cuda.memory._dump_snapshot(path)
    return path, False
