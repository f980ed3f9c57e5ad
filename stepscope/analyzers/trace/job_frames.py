"""Which frames of a recorded stack are the job's own code: one rule for every reader.

A block of memory (or a moment of time) is attributed to "the job's innermost line":
the frame nearest the allocation that is neither torch, stepscope's in-job code nor the
standard library. Two readers need it, with stacks written two ways: the Kineto
trace's Python tracer (``file.py(12): forward``, ``memory_peak.py``) and the CUDA
allocator's snapshot (frames ``{filename, line, name}``, ``allocator_snapshot.py``).
Both go through ``is_job_file``, so both tables name the same lines.

Libraries the job chose (transformers, timm) count as the job's: their line is where
its memory went, and torch's frames below them never are.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["is_job_file", "is_job_frame"]

_FRAME = re.compile(r"^(?P<file>[^()]+)\((?P<line>\d+)\): (?P<func>.+)$")
_NOT_THE_JOB = {"torch", "functorch", "stepscope", "triton", "<frozen"}
#: torch and its compilers, installed anywhere (the trace names them relative to
#: site-packages, the snapshot by absolute path)
_LIBRARY = re.compile(r"(?:site|dist)-packages/(?:torch|functorch|triton)/")
#: the standard library by absolute path, on whatever machine recorded the stack
#: (``/usr/lib/python3.12/threading.py``, a venv's or conda's ``lib/python3.11/``)
_STDLIB_DIR = re.compile(r"/lib/python3\.\d+/(?!.*(?:site|dist)-packages/)")
#: stepscope's in-job code by absolute path (an editable install's frames are not
#: relative to site-packages), here or on the machine that recorded the stack
_OWN_CODE = (
    str(Path(__file__).resolve().parents[2]) + "/",
    "/stepscope/collectors/",
    "/stepscope/fixes/",
)
_STDLIB = set(getattr(sys, "stdlib_module_names", ()))


def is_job_file(path: str) -> bool:
    """A source file of the job (or of a library it chose), not torch's, stepscope's
    or the standard library's."""
    path = path.replace("\\", "/")
    head = path.split("/", 1)[0]
    if head in _NOT_THE_JOB or _LIBRARY.search(path) or path.startswith("<"):
        return False
    if path.startswith(_OWN_CODE[0]) or any(part in path for part in _OWN_CODE[1:]):
        return False  # the step timer's wrapper of backward() is not the job's line
    if _STDLIB_DIR.search(path):
        return False
    return not ("/" not in path and path.removesuffix(".py") in _STDLIB)


def is_job_frame(name: str) -> bool:
    """A Python tracer frame of the trace (``file.py(12): forward``) in the job's code."""
    m = _FRAME.match(name)
    return bool(m) and is_job_file(m["file"])
