"""Load Kineto (PyTorch profiler) traces into columnar arrays.

This module reads and checks the files (one-line ``TraceError``s), puts the ranks in
order and finds the steps; ``trace.columns`` turns each file's events into columns.
Every analysis in stepscope works on the ``Trace`` this module returns, never on the
JSON: the parsed list of event dicts costs ~10x the file size in Python objects, so
each file's columns are built straight from the parsed list and the list is dropped
before the next file is read. Peak memory is therefore one file's parsed JSON plus
the columns of all files, not the parsed JSON of all files.

Times are int64 nanoseconds: Kineto writes microseconds (floats in recent versions,
sub-microsecond digits in the "ns resolution" variant); ``displayTimeUnit`` only
affects how a viewer shows them.

``Trace.op_args`` keeps, from the same single parse, the args that the FLOP counting
(``hardware.flops``) reads, for only the operators it reads them from: a few thousand
rows, so no analysis has to parse a file twice and loading stays as fast.
"""

from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pandas.api.types import union_categoricals

from stepscope.analyzers.trace import pieces
from stepscope.analyzers.trace.columns import complete_events, memory_events, split_events
from stepscope.analyzers.trace.flop_ops import keeps_op_args
from stepscope.analyzers.trace.typed_events import decode_document
from stepscope.store import bounded_read
from stepscope.store.artifacts import s3_error, s3_filesystem

_STEP_PREFIX = "ProfilerStep#"


class TraceError(ValueError):
    """A trace file that cannot be analysed; the message is one line: '<path>: <problem>'."""


@dataclass
class Trace:
    """All ranks of one profiled job, as columns (see the module docstring for units)."""

    events: pd.DataFrame
    memory: pd.DataFrame
    steps: pd.DataFrame
    ranks: list[int]
    meta: dict[int, dict]
    warnings: list[str] = field(default_factory=list)
    has_device: bool = False
    #: The args of the operators ``keeps_op_args`` names, one row per event, in file
    #: order per rank: ``row`` (its row in ``events``), ``name``, ``args`` (the JSON bytes
    #: of ["Input Dims", "Input type", "Concrete Inputs"], null where absent) and ``seq``
    #: ("Sequence number", -1 where none). None for a Trace not built by load_trace.
    op_args: pd.DataFrame | None = None


# -- reading -------------------------------------------------------------------------


def trace_files(paths: str | Path | Sequence[str | Path]) -> list[Path | str]:
    """Expand folders into their *.json / *.json.gz files (sorted, so ranks are stable).

    An ``s3://bucket/key`` string stays one source, read where it is analysed (a Ray
    task reads its own rank); ``s3://bucket/prefix/`` (a trailing /) stands for the
    traces directly under it.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path | str] = []
    for raw in paths:
        if isinstance(raw, str) and is_s3(raw):
            out.extend(_s3_traces(raw) if raw.endswith("/") else [raw])
            continue
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                q for q in p.iterdir() if q.is_file() and q.name.endswith((".json", ".json.gz"))
            )
            if not found:
                raise TraceError(f"{p}: folder holds no *.json or *.json.gz trace")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    if not out:
        raise TraceError("no trace paths given")
    return out


def is_s3(source: str | Path) -> bool:
    """Whether a trace source is an object in S3 (only a string can be: a Path folds //)."""
    return isinstance(source, str) and source.startswith("s3://")


def _s3_failure(uri: str, exc: BaseException) -> TraceError:
    """One line naming the URI, in store/artifacts.py's words (object missing, ...)."""
    text = str(s3_error(uri, exc))
    return TraceError(text if text.startswith(uri) else f"{uri}: {text}")


def _s3_traces(prefix: str) -> list[str]:
    try:
        names = s3_filesystem().ls(prefix, detail=False)
    except Exception as exc:
        error = _s3_failure(prefix, exc)
        if not str(error).endswith(": object missing"):
            raise error from None
        names = []  # S3 has no folders: nothing under the prefix
    found = sorted(f"s3://{n}" for n in names if n.endswith((".json", ".json.gz")))
    if not found:
        raise TraceError(f"{prefix}: holds no *.json or *.json.gz trace")
    return found


def read_bytes(source: Path | str) -> bytes:
    """A local file's or an ``s3://bucket/key`` object's bytes, with one-line errors."""
    if is_s3(source):
        try:
            return s3_filesystem().cat_file(source)
        except Exception as exc:
            raise _s3_failure(str(source), exc) from None
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise TraceError(f"{source}: cannot read ({exc.strerror or exc})") from None


def read_json(path: Path | str) -> Any:
    """Decompress into one buffer and parse it with orjson, with one-line errors.

    Reading the whole file and parsing it in one call is the fastest path and costs
    the decompressed size once; the buffer is released as soon as orjson is done.
    """
    return parse_json(path, read_text(path))


def read_text(path: Path | str) -> bytes | bytearray:
    """The file's JSON text, decompressed a piece at a time up to the cap on a trace's
    JSON (``store/bounded_read.py``: ``$STEPSCOPE_MAX_TRACE_BYTES``, 4 GiB by default);
    one-line errors for what cannot be read and for a file over the cap."""
    try:
        if is_s3(path):
            data = bounded_read.capped_bytes(path, read_bytes(path))
        else:
            data = bounded_read.read_capped(path)
    except bounded_read.ReadError as exc:
        raise TraceError(str(exc)) from None
    if not data[:4096].strip() and not data.strip():
        raise TraceError(f"{path}: empty file")
    return data


def parse_json(path: Path | str, data: bytes | bytearray) -> Any:
    """``orjson.loads`` with the one-line errors (and the bare N/A some Kineto writes)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # Some Kineto versions write a bare N/A; tb-profiler quotes it and retries, so do we.
        if b"N/A" in data:
            try:
                return orjson.loads(re.sub(rb'(?<!")N/A(?!")', b'"N/A"', data))
            except orjson.JSONDecodeError:
                pass
        problem = "truncated JSON" if _looks_truncated(data, exc) else "not valid JSON"
        raise TraceError(f"{path}: {problem} ({exc})") from None


def _looks_truncated(data: bytes | bytearray, exc: orjson.JSONDecodeError) -> bool:
    starts_like_json = data.lstrip()[:1] in (b"{", b"[")
    return starts_like_json and exc.pos >= len(data.rstrip()) - 1


def _event_list(path: Path, doc: Any) -> tuple[list, dict]:
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    elif isinstance(doc, list):
        events, meta = doc, {}
    else:
        raise TraceError(f"{path}: not a Kineto trace (JSON {type(doc).__name__})")
    if not events:
        raise TraceError(f"{path}: trace has no events")
    if not all(isinstance(e, dict) for e in events[:100]) or not any(
        "ph" in e for e in events[:100]
    ):
        raise TraceError(f"{path}: not a Kineto trace (events are not trace-event objects)")
    return events, meta


# -- one Trace from the files ----------------------------------------------------------


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while traces are parsed and turned into columns.

    orjson and the column building allocate millions of dicts and tuples; every burst
    of allocations triggers a collection that walks all live containers, i.e. the whole
    parsed trace, which on 1 M events makes loading ~3x slower. Nothing built here forms
    reference cycles, so reference counting frees it all the same.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _steps(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Host-side ProfilerStep#N ranges; GPU-side copies (gpu_user_annotation) are skipped."""
    names = events["name"]
    step_codes = [i for i, c in enumerate(names.cat.categories) if str(c).startswith(_STEP_PREFIX)]
    host = events["cat"].isin(["cpu_op", "user_annotation"]).to_numpy()
    mask = names.cat.codes.isin(step_codes).to_numpy() & host
    rows = events.loc[mask, ["name", "ts", "end"]]
    numbers = []
    for n in rows["name"].astype(str):
        tail = n[len(_STEP_PREFIX) :]
        numbers.append(int(tail) if tail.isdigit() else -1)
    return pd.DataFrame(
        {
            "rank": np.full(len(rows), rank, dtype=np.int16),
            "step": np.asarray(numbers, dtype=np.int64),
            "start": rows["ts"].to_numpy(),
            "end": rows["end"].to_numpy(),
        }
    )


def _rank_of(meta: dict, index: int) -> int:
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return dist["rank"]
    return index


def _columns_in_pieces(
    path: Path, data: bytes | bytearray, index: int
) -> tuple[int, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """``_load_one``'s columns, built piece by piece (``pieces.py``), then put in the
    order one piece would have had: events by (ts, -dur), stably, so ties keep file
    order; memory by ts; op args in file order, their rows following the sort."""
    meta, parts = pieces.event_pieces(data)
    rank = _rank_of(meta, index)
    evs, mems, args = [], [], []
    offset = 0
    for events in parts:
        xs, mem = split_events(events)
        del events
        if xs:
            ev, op_args = complete_events(xs, rank, keeps_op_args)
            evs.append(ev)
            args.append(op_args.assign(row=op_args["row"].to_numpy() + offset))
            offset += len(ev)
        del xs
        mems.append(memory_events(mem, rank))
    if not evs:
        raise TraceError(f"{path}: trace has no complete ('X') events")
    names = union_categoricals([f["name"] for f in evs], sort_categories=True)
    ev = pd.concat([f.drop(columns="name") for f in evs], ignore_index=True)
    ev.insert(ev.columns.get_loc("cat") + 1, "name", names)
    del evs
    order = np.lexsort((-ev["dur"].to_numpy(), ev["ts"].to_numpy()))
    ev = ev.take(order).reset_index(drop=True)
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    # pieces without such operators have empty, untyped columns: they would make the
    # concatenation's name column untyped too
    op_args = pd.concat([a for a in args if len(a)] or args[:1], ignore_index=True)
    op_args["row"] = position[op_args["row"].to_numpy()]
    memory = pd.concat(mems, ignore_index=True).sort_values("ts", kind="stable", ignore_index=True)
    return rank, ev, memory, op_args, meta


def _load_one(path: Path, index: int) -> tuple[int, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    data = read_text(path)
    loaded = None
    if len(data) >= pieces.MIN_BYTES:  # a big file: parsed a piece at a time
        with contextlib.suppress(pieces.NoCut):
            loaded = _columns_in_pieces(path, data, index)
    if loaded is None:  # inline, so that each big object is freed as soon as it is used
        typed = decode_document(data)  # records, not dicts: most traces (typed_events.py)
        if typed is not None:
            meta, events = typed
        else:  # read the dict way: tolerant of odd traces, one-line errors for bad ones
            doc = parse_json(path, data)
            events, meta = _event_list(path, doc)
            del doc
        del data, typed
        xs, mem = split_events(events)
        del events
        if not xs:
            raise TraceError(f"{path}: trace has no complete ('X') events")
        rank = _rank_of(meta, index)
        ev, op_args = complete_events(xs, rank, keeps_op_args)
        del xs
        loaded = rank, ev, memory_events(mem, rank), op_args, meta
    rank, ev, memory, op_args, meta = loaded
    dist = meta.get("distributedInfo")
    info = {
        "path": str(path),
        "deviceProperties": meta.get("deviceProperties") or [],
        "distributedInfo": dist or {},
        "schemaVersion": meta.get("schemaVersion"),
        "displayTimeUnit": meta.get("displayTimeUnit"),
        "baseTimeNanoseconds": meta.get("baseTimeNanoseconds"),
    }
    return rank, ev, memory, op_args, info


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate per-rank frames keeping 'name' categorical (plain concat makes it object)."""
    if len(frames) == 1:
        return frames[0]
    names = union_categoricals([f["name"] for f in frames], ignore_order=True)
    out = pd.concat([f.drop(columns="name") for f in frames], ignore_index=True)
    out.insert(out.columns.get_loc("cat") + 1, "name", names)
    return out


def _concat_op_args(frames: list[tuple[pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """Each rank's op args with ``row`` shifted to its rank's rows in the concatenated
    events (ranks are concatenated in the same order as the events)."""
    out, offset = [], 0
    for ev, args in frames:
        out.append(args.assign(row=args["row"].to_numpy() + offset) if offset else args)
        offset += len(ev)
    if len(out) == 1:
        return out[0]
    return pd.concat(out, ignore_index=True).astype({"row": np.int64})


def load_trace(paths: str | Path | Sequence[str | Path]) -> Trace:
    """Load one or more trace files (one per rank) into one ``Trace``.

    A folder stands for every *.json / *.json.gz in it. The rank of a file is its
    ``distributedInfo.rank``, else its position in the list; two files claiming the
    same rank fall back to positions, with a warning.
    """
    files = trace_files(paths)
    with _gc_paused():
        loaded = [_load_one(p, i) for i, p in enumerate(files)]
    warnings: list[str] = []
    ranks = [r for r, *_ in loaded]
    if len(set(ranks)) != len(ranks):
        warnings.append(
            "several files claim the same distributedInfo.rank; ranks are file positions"
        )
        for i, (_, ev, mem, *_rest) in enumerate(loaded):
            ev["rank"] = np.int16(i)
            mem["rank"] = np.int16(i)
        loaded = [(i, *rest) for i, (_, *rest) in enumerate(loaded)]
    loaded.sort(key=lambda t: t[0])

    step_frames = []
    for rank, ev, _mem, _args, info in loaded:
        st = _steps(ev, rank)
        if st.empty:
            warnings.append(
                f"{info['path']}: no ProfilerStep# annotations; the whole trace is one window"
            )
            st = pd.DataFrame(
                {
                    "rank": np.array([rank], dtype=np.int16),
                    "step": np.array([-1], dtype=np.int64),
                    "start": np.array([ev["ts"].min()], dtype=np.int64),
                    "end": np.array([ev["end"].max()], dtype=np.int64),
                }
            )
        step_frames.append(st)

    events = _concat([ev for _, ev, *_ in loaded])
    memory = pd.concat([m for _, _, m, *_ in loaded], ignore_index=True)
    steps = pd.concat(step_frames, ignore_index=True)
    meta = {rank: info for rank, *_, info in loaded}
    return Trace(
        events=events,
        memory=memory,
        steps=steps,
        ranks=[r for r, *_ in loaded],
        meta=meta,
        warnings=warnings,
        has_device=bool(events["on_device"].any()),
        op_args=_concat_op_args([(ev, a) for _, ev, _, a, _ in loaded]),
    )
