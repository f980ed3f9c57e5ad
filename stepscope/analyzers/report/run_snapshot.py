"""A recorded run's CUDA allocator snapshot: the latest one, read only if stepscope wrote it.

A run's ``memory_snapshot`` rows are a capture's (``<stem>.memory_snapshot.pickle``, at
the window's end) or the out-of-memory error's (``oom.memory_snapshot.pickle``, or a
capture's dumped at the error, meta ``reason: oom``). The latest row is read: the
error comes after every capture, and a later capture of a running job replaces an
earlier one.

Whoever can write the shared store can write a row, so a row is read only when its
file is one stepscope writes: kind ``memory_snapshot``, a name ending in
``.memory_snapshot.pickle`` (before and after links are resolved), in the run's own
places (``store/artifact_paths.py``, through ``artifact_files``); and it is read as
plain data (``store/plain_pickle.py``), never executed. Anything else is one line in
the caller's ``problems``, and the rest of the run's memory is shown all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepscope.analyzers.trace.allocator_snapshot import (
    AllocatorSnapshot,
    SnapshotError,
    read_snapshot,
)
from stepscope.store.artifacts import artifact_files

__all__ = ["SNAPSHOT_KIND", "SNAPSHOT_SUFFIX", "has_snapshot", "run_snapshot"]

SNAPSHOT_KIND = "memory_snapshot"
SNAPSHOT_SUFFIX = ".memory_snapshot.pickle"


def has_snapshot(arts: Any) -> bool:
    """The run (``store.artifacts``) has a snapshot row."""
    return len(arts) > 0 and bool((arts["kind"] == SNAPSHOT_KIND).any())


def run_snapshot(
    store: Any, run_id: int, arts: Any = None
) -> tuple[AllocatorSnapshot | None, list[str]]:
    """(The run's latest snapshot, []); (None, []) for a run without one; (None, [the
    one line]) for one that is not read."""
    arts = store.artifacts(run_id) if arts is None else arts
    if not has_snapshot(arts):
        return None, []
    row = arts[arts["kind"] == SNAPSHOT_KIND].iloc[-1]
    named = str((row["meta"] or {}).get("local_path") or row["path"])
    if not _ours(named):
        return None, [_not_ours(run_id, named)]
    files, problems = artifact_files([row], store.home)
    if problems:
        return None, problems
    path = files[0]
    if not _ours(str(path)):  # a link of that name to another file of the run's folder
        return None, [_not_ours(run_id, f"{named} (-> {path})")]
    try:
        return read_snapshot(path), []
    except SnapshotError as exc:
        return None, [str(exc)]


def _ours(path: str) -> bool:
    return Path(path).name.endswith(SNAPSHOT_SUFFIX)


def _not_ours(run_id: int, path: str) -> str:
    return (
        f"run {run_id}: memory_snapshot artifact {path} is not a snapshot file stepscope "
        f"writes (*{SNAPSHOT_SUFFIX}); not read"
    )
