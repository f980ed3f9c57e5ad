"""CUDA allocator snapshots built by hand, in torch's format, for tests without a GPU.

Provenance, honestly: none of these was recorded. They are written from torch 2.13's
description of the format, ``torch.cuda.memory._snapshot``'s docstring (the TypedDicts
``Snapshot``, ``Segment``, ``Block``, ``Frame``, ``TraceEntry``), with the key names and
state strings that ``torch/csrc/cuda/Module.cpp`` writes (``device`` and ``is_expandable``
on a segment, ``active_pending_free`` where the docstring says ``active_awaiting_free``,
``device_free`` instead of ``addr`` on an ``oom`` entry, ``time_us``, ``compile_context``,
``user_metadata``) and the way ``torch/cuda/_memory_viz.py`` reads them (a segment's
``total_size`` is the sum of its blocks' sizes; frames innermost first). The file is
written as ``torch.cuda.memory._dump_snapshot`` writes it: ``pickle.dump`` of the dict.
tests/gpu/check_allocator_snapshot.py checks the reader against real snapshots on a GPU.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GiB, MiB = 1 << 30, 1 << 20

# A stack as torch records it with context="all": C++ frames first (innermost), then
# Python's, innermost first: torch's own, the job's function, the job's caller.
CPP = [
    {"name": "c10::cuda::CUDACachingAllocator::Native::malloc", "filename": "??", "line": 0},
    {
        "name": "at::native::empty_cuda",
        "filename": "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp",
        "line": 57,
    },
]


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def stack(*python: dict[str, Any]) -> list[dict[str, Any]]:
    """C++ frames, then ``python`` (innermost first)."""
    return [*CPP, *python]


TORCH_LINEAR = frame(
    "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"
)
STEPSCOPE_BACKWARD = frame(
    "/opt/stepscope/stepscope/collectors/steps/step_timer.py", 256, "backward"
)
THREADING = frame("/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner")
JOB_HOLD = frame("/home/me/train.py", 12, "hold")
JOB_MAIN = frame("/home/me/train.py", 40, "main")
JOB_STEP = frame("/home/me/train.py", 30, "step")


def block(
    size: int,
    state: str = "active_allocated",
    frames: Sequence[dict[str, Any]] = (),
    requested: int | None = None,
) -> dict[str, Any]:
    """A block (``address`` is filled in by ``segment``)."""
    return {
        "size": size,
        "requested_size": size if requested is None else requested,
        "address": 0,
        "state": state,
        "frames": list(frames) if not isinstance(frames, list) else frames,
    }


def segment(
    blocks: list[dict[str, Any]],
    *,
    device: int = 0,
    address: int = 0x7F0000000000,
    expandable: bool = False,
) -> dict[str, Any]:
    """A segment of ``blocks`` laid out from ``address``, its sizes as torch sums them."""
    at = address
    for b in blocks:
        b["address"] = at
        at += b["size"]
    total = sum(b["size"] for b in blocks)
    active = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b["requested_size"] for b in active),
        "stream": 0,
        "segment_type": "large" if total > MiB else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": expandable,
        "frames": [],
        "blocks": blocks,
    }


def entry(action: str, addr: int, size: int, frames: Sequence[dict[str, Any]] = ()) -> dict:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": 1_700_000_000_000_000,
        "compile_context": "",
        "user_metadata": "",
        "frames": list(frames),
    }


def oom_entry(size: int, device_free: int, time_us: int = 1_700_000_000_000_100) -> dict:
    """The allocator's ``oom`` entry: ``device_free`` where others have ``addr``."""
    e = entry("oom", 0, size, stack(JOB_HOLD, JOB_MAIN))
    del e["addr"]
    e["device_free"] = device_free
    e["time_us"] = time_us
    return e


def snapshot(segments: list[dict[str, Any]], traces: list[list[dict]] | None = None) -> dict:
    return {
        "segments": segments,
        "device_traces": traces if traces is not None else [[]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
        "external_annotations": [],
    }


def write_snapshot(path: Path, snap: dict[str, Any]) -> Path:
    """As ``torch.cuda.memory._dump_snapshot`` writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return path


def capture_snapshot() -> dict[str, Any]:
    """A capture's snapshot: no OOM; shared stacks, a block from before the history,
    a pending free, a small segment, the job's lines behind torch's and stepscope's."""
    held = stack(TORCH_LINEAR, JOB_HOLD, JOB_MAIN)  # one list, shared by two blocks
    big = segment(
        [
            block(512 * MiB, frames=held),
            block(256 * MiB, "inactive"),
            block(128 * MiB, frames=held),
            block(64 * MiB, "active_pending_free", stack(JOB_STEP)),
            block(64 * MiB, "inactive"),
        ]
    )
    grads = segment(
        [
            block(96 * MiB, frames=stack(STEPSCOPE_BACKWARD, TORCH_LINEAR, JOB_STEP, JOB_MAIN)),
            block(32 * MiB, frames=[]),  # allocated before history was recorded
        ],
        address=0x7F1000000000,
    )
    small = segment(
        [block(512 * 1024, frames=stack(THREADING)), block(1536 * 1024, "inactive")],
        address=0x7F2000000000,
    )
    trace = [
        entry("segment_alloc", big["address"], big["total_size"]),
        entry("alloc", big["address"], 512 * MiB, held),
        entry("snapshot", 0, 0),
    ]
    return snapshot([big, grads, small], [trace])


def fragmented_oom() -> dict[str, Any]:
    """Four 2 GiB segments each holding a 1 GiB tensor at its start: 4 GiB cached free,
    in 1 GiB pieces; a 1.5 GiB request with 512 MiB left on the device fails."""
    segs = [
        segment(
            [block(GiB, frames=stack(JOB_HOLD, JOB_MAIN)), block(GiB, "inactive")],
            address=0x7F0000000000 + i * 4 * GiB,
        )
        for i in range(4)
    ]
    return snapshot(segs, [[entry("alloc", 0, GiB), oom_entry(3 * GiB // 2, 512 * MiB)]])


def full_oom() -> dict[str, Any]:
    """Every segment full: a 20 GiB request with 1 GiB on the device and 64 MiB cached."""
    segs = [
        segment([block(6 * GiB, frames=stack(JOB_HOLD, JOB_MAIN))]),
        segment(
            [block(2 * GiB, frames=stack(JOB_STEP, JOB_MAIN)), block(64 * MiB, "inactive")],
            address=0x7F1000000000,
        ),
    ]
    return snapshot(segs, [[oom_entry(20 * GiB, GiB)]])
