"""The CUDA caching allocator's snapshot: what it holds, how fragmented, who asked.

A capture on CUDA records the allocator's history and dumps its snapshot when the
window ends (``<stem>.memory_snapshot.pickle``); a job that runs out of device memory
while history is recorded dumps one at the error (``oom.memory_snapshot.pickle``, or
the capture's own). The file is ``torch.cuda.memory._snapshot()`` pickled: the
format is the TypedDicts of that function's docstring (``Snapshot``, ``Segment``,
``Block``, ``Frame``, ``TraceEntry``) and what ``torch/csrc/cuda/Module.cpp`` writes,
read as ``torch/cuda/_memory_viz.py`` reads it (torch 2.1 to 2.13):

* ``segments``: each ``cudaMalloc`` the allocator holds (``total_size``; ``device``),
  cut into ``blocks`` (``size``, ``requested_size``, ``state``: ``active_allocated``
  for a tensor's, ``active_pending_free`` for one freed while another stream may still
  use it, ``inactive`` for cached and free; ``frames``, innermost first, where it was
  allocated: empty for a block allocated before history was recorded);
* ``device_traces``: per device, the allocator's last actions (``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
  ``oom``, ``snapshot``...); an ``oom`` entry has ``size`` (the request, rounded to
  512 bytes) and ``device_free`` (what ``cudaMemGetInfo`` reported free, after the
  allocator released its cached segments and before it raised).

What it gives, at the moment of the dump (the window's end or the error, never the
step's peak: ``memory_peak.py`` has the peak): reserved bytes (the segments; torch's
``memory_reserved()``), allocated (the active blocks; ``memory_allocated()``),
reserved but unused (the inactive blocks), the largest free block (a request larger
than it needs a new segment, however much is free in total: fragmentation), the
segment count, and the job's lines holding the active blocks (the innermost frame of
the job's own code, ``job_frames.py``). For an OOM: the request and the device's free
bytes, and from them one sentence: fragmentation, or memory full and who holds it.

The file is read through ``store/plain_pickle.py``: nothing in it is executed.
A file that is not such a snapshot is one line (``SnapshotError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.analyzers.trace.job_frames import is_job_file
from stepscope.store.bounded_read import fmt_size
from stepscope.store.plain_pickle import PlainPickleError, load_plain_pickle

__all__ = [
    "AllocatorSnapshot",
    "OomRequest",
    "SnapshotError",
    "read_snapshot",
    "snapshot_figures",
]

TOP_SITES = 10
#: Blocks read in all (a hostile file can make every segment share one long list of
#: blocks: its cost would be their product). A real snapshot holds thousands.
MAX_BLOCKS = 5_000_000
#: Frames looked at per stack for the job's line (C++ frames come first with
#: ``context="all"``: a few dozen)
MAX_FRAMES = 256
_MAX_INT = 1 << 62  # bytes beyond any device: not a snapshot's
_SITE_CHARS = 300
_ALLOCATED, _INACTIVE = "active_allocated", "inactive"


class SnapshotError(ValueError):
    """The file is not an allocator snapshot stepscope can read; one line naming it."""


@dataclass(frozen=True)
class OomRequest:
    """The allocator's ``oom`` trace entry: the request that failed, and what the
    device had free when it failed."""

    asked_bytes: int
    device_free_bytes: int


@dataclass
class AllocatorSnapshot:
    """One device's figures from one snapshot file (see the module docstring)."""

    path: str
    device: int
    reserved_bytes: int
    allocated_bytes: int
    unused_bytes: int  # inactive blocks: cached, free for reuse
    pending_free_bytes: int  # freed, waiting on another stream's use
    largest_free_block_bytes: int
    segments: int
    expandable: bool  # its segments are expandable (PYTORCH_CUDA_ALLOC_CONF)
    sites: pd.DataFrame  # site, bytes, blocks: the active blocks by the job's line
    no_site_bytes: int  # active bytes with no frame of the job's code
    oom: OomRequest | None = None

    @property
    def moment(self) -> str:
        """When its figures hold: stepscope dumps a snapshot at a capture's end or at an
        out-of-memory error, whose trace then ends with the ``oom`` entry."""
        return "the out-of-memory error" if self.oom else "the capture's end"

    @property
    def free_total_bytes(self) -> int | None:
        """At an OOM: the device's free bytes and the allocator's cached free blocks."""
        return None if self.oom is None else self.oom.device_free_bytes + self.unused_bytes

    @property
    def fragmented(self) -> bool | None:
        """At an OOM: the request fitted in the free total, but in no free block (nor
        in what the device had left). None without an OOM."""
        if self.oom is None:
            return None
        largest = max(self.largest_free_block_bytes, self.oom.device_free_bytes)
        return self.oom.asked_bytes <= (self.free_total_bytes or 0) and (
            self.oom.asked_bytes > largest
        )

    def explanation(self) -> str | None:
        """One sentence on why the request failed; None without an OOM."""
        oom, free = self.oom, self.free_total_bytes
        if oom is None or free is None:
            return None
        asked = f"asked for {fmt_size(oom.asked_bytes)} with {fmt_size(free)} free in total"
        parts = (
            f"{fmt_size(self.unused_bytes)} cached unused, "
            f"{fmt_size(oom.device_free_bytes)} on the device"
        )
        if self.fragmented:
            largest = max(self.largest_free_block_bytes, oom.device_free_bytes)
            fix = (
                "fragmentation, with expandable segments already on"
                if self.expandable
                else "fragmentation: expandable segments would help"
            )
            return f"{asked} ({parts}) but the largest free block is {fmt_size(largest)} ({fix})"
        held = ", ".join(f"{r.site} {fmt_size(r.bytes)}" for r in self.sites.head(3).itertuples())
        return (
            f"{asked} ({parts}): the memory is full, not fragmented; "
            f"{fmt_size(self.allocated_bytes)} allocated"
            + (f", held most by {held}" if held else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``stepscope memory --json``'s ``allocator_snapshot``)."""
        return {
            "path": self.path,
            "moment": self.moment,
            "device": f"cuda:{self.device}",
            "reserved_bytes": self.reserved_bytes,
            "allocated_bytes": self.allocated_bytes,
            "reserved_unused_bytes": self.unused_bytes,
            "pending_free_bytes": self.pending_free_bytes,
            "largest_free_block_bytes": self.largest_free_block_bytes,
            "segments": self.segments,
            "expandable_segments": self.expandable,
            "sites": [
                {"site": r.site, "bytes": int(r.bytes), "blocks": int(r.blocks)}
                for r in self.sites.itertuples()
            ],
            "no_site_bytes": self.no_site_bytes,
            "oom": None
            if self.oom is None
            else {
                "asked_bytes": self.oom.asked_bytes,
                "device_free_bytes": self.oom.device_free_bytes,
                "free_total_bytes": self.free_total_bytes,
                "fragmented": self.fragmented,
            },
            "explanation": self.explanation(),
        }


def read_snapshot(path: str | Path, device: int | None = None) -> AllocatorSnapshot:
    """The figures of the snapshot file ``path`` (read without executing anything);
    ``device``: which device's (None: the one that ran out, else the one reserving
    most). Raises SnapshotError, one line naming the file."""
    try:
        data = load_plain_pickle(path)
    except PlainPickleError as exc:
        raise SnapshotError(str(exc)) from None
    return snapshot_figures(data, str(path), device)


def snapshot_figures(data: Any, path: str, device: int | None = None) -> AllocatorSnapshot:
    """The figures of an unpickled snapshot (``torch.cuda.memory._snapshot()``'s dict)."""
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise SnapshotError(f"{path}: not a CUDA allocator snapshot (no list of segments)")
    traces = data.get("device_traces") or []
    if not isinstance(traces, list):
        raise SnapshotError(f"{path}: not a CUDA allocator snapshot (device_traces)")
    segments = [_dict(s, path, "a segment") for s in data["segments"]]
    oom, oom_device = _last_oom(traces, path)
    if device is None:
        device = oom_device if oom_device is not None else _busiest(segments, path)
    mine = [s for s in segments if _int(s.get("device", 0), path, "a segment's device") == device]
    reserved = allocated = unused = pending = largest = seen = no_site = 0
    expandable = False
    sites: dict[str, list[int]] = {}
    by_stack: dict[int, str | None] = {}  # frames lists are shared between blocks
    for seg in mine:
        reserved += _int(seg.get("total_size"), path, "a segment's total_size")
        expandable = expandable or seg.get("is_expandable") is True
        blocks = seg.get("blocks")
        if not isinstance(blocks, list):
            raise SnapshotError(f"{path}: not a CUDA allocator snapshot (a segment's blocks)")
        seen += len(blocks)
        if seen > MAX_BLOCKS:
            raise SnapshotError(f"{path}: more than {MAX_BLOCKS} blocks; not read")
        for raw in blocks:
            block = _dict(raw, path, "a block")
            size = _int(block.get("size"), path, "a block's size")
            state = block.get("state")
            if state == _INACTIVE:
                unused += size
                largest = max(largest, size)
            elif state == _ALLOCATED:
                allocated += size
                frames = block.get("frames")
                key = id(frames)
                if key not in by_stack:
                    by_stack[key] = _site(frames)
                site = by_stack[key]
                if site is None:
                    no_site += size
                else:
                    entry = sites.setdefault(site, [0, 0])
                    entry[0] += size
                    entry[1] += 1
            elif isinstance(state, str) and state.startswith("active"):
                pending += size  # active_pending_free (torch's docstring: active_awaiting_free)
            else:
                raise SnapshotError(f"{path}: not a CUDA allocator snapshot (block state)")
    table = pd.DataFrame(
        [(s, b, n) for s, (b, n) in sites.items()], columns=["site", "bytes", "blocks"]
    )
    table = table.sort_values(["bytes", "site"], ascending=[False, True], kind="stable")
    return AllocatorSnapshot(
        path=path,
        device=device,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        unused_bytes=unused,
        pending_free_bytes=pending,
        largest_free_block_bytes=largest,
        segments=len(mine),
        expandable=expandable,
        sites=table.head(TOP_SITES).reset_index(drop=True),
        no_site_bytes=no_site,
        oom=oom,
    )


def _dict(value: Any, path: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{path}: not a CUDA allocator snapshot ({what} is not a dict)")
    return value


def _int(value: Any, path: str, what: str) -> int:
    """A count of bytes (or an index) as the snapshot must hold it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_INT:
        shown = "out of range" if isinstance(value, int) else type(value).__name__
        raise SnapshotError(f"{path}: not a CUDA allocator snapshot ({what}: {shown})")
    return value


def _busiest(segments: list[dict[str, Any]], path: str) -> int:
    """The device whose segments reserve the most (0 for a snapshot of none)."""
    by_device: dict[int, int] = {}
    for seg in segments:
        dev = _int(seg.get("device", 0), path, "a segment's device")
        size = _int(seg.get("total_size"), path, "a segment's total_size")
        by_device[dev] = by_device.get(dev, 0) + size
    return max(by_device, key=lambda d: (by_device[d], -d)) if by_device else 0


def _last_oom(traces: list[Any], path: str) -> tuple[OomRequest | None, int | None]:
    """The latest ``oom`` entry of any device's trace (by its ``time_us`` where the
    snapshot has it), and that device."""
    best: tuple[float, OomRequest, int] | None = None
    for device, entries in enumerate(traces):
        if not isinstance(entries, list):
            raise SnapshotError(f"{path}: not a CUDA allocator snapshot (a device trace)")
        for entry in reversed(entries):
            if isinstance(entry, dict) and entry.get("action") == "oom":
                request = OomRequest(
                    _int(entry.get("size"), path, "the oom entry's size"),
                    _int(entry.get("device_free"), path, "the oom entry's device_free"),
                )
                when = entry.get("time_us")
                at = float(when) if isinstance(when, int | float) else 0.0
                if best is None or at > best[0]:
                    best = (at, request, device)
                break
    return (None, None) if best is None else (best[1], best[2])


def _site(frames: Any) -> str | None:
    """``path:line in function`` of the innermost frame of the job's code (frames are
    innermost first; C++ frames, recorded with ``context="all"``, are never the job's)."""
    if not isinstance(frames, list):
        return None
    for frame in frames[:MAX_FRAMES]:
        if not isinstance(frame, dict):
            continue
        filename, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
        if not isinstance(filename, str) or not filename.endswith(".py"):
            continue
        if is_job_file(filename):
            text = f"{filename}:{line} in {name}"
            return "".join(c if c.isprintable() else "?" for c in text)[:_SITE_CHARS]
    return None
