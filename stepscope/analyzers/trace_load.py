"""Load Kineto (PyTorch profiler) traces into columnar arrays.

Every analysis in stepscope works on the ``Trace`` this module returns, never on the
JSON: the parsed list of event dicts costs ~10x the file size in Python objects, so
each file's columns are built straight from the parsed list and the list is dropped
before the next file is read. Peak memory is therefore one file's parsed JSON plus
the columns of all files, not the parsed JSON of all files.

Times are int64 nanoseconds: Kineto writes microseconds (floats in recent versions,
sub-microsecond digits in the "ns resolution" variant); ``displayTimeUnit`` only
affects how a viewer shows them.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pandas.api.types import union_categoricals

#: The normalised categories; anything else becomes 'other'.
CATEGORIES = [
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "other",
]
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

# Old (tb-profiler era) names and lower-case variants -> the current Kineto names.
# 'python' is the pre-python_function Python tracer; tb-profiler treats it as an operator.
_CAT_MAP = {c: c for c in CATEGORIES}
_CAT_MAP.update(
    {
        "Operator": "cpu_op",
        "operator": "cpu_op",
        "Python": "cpu_op",
        "python": "cpu_op",
        "Runtime": "cuda_runtime",
        "runtime": "cuda_runtime",
        "Kernel": "kernel",
        "Memcpy": "gpu_memcpy",
        "memcpy": "gpu_memcpy",
        "Memset": "gpu_memset",
        "memset": "gpu_memset",
    }
)
_EMPTY: dict[str, Any] = {}
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


# -- reading -------------------------------------------------------------------------


def trace_files(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand folders into their *.json / *.json.gz files (sorted, so ranks are stable)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
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


def read_json(path: Path) -> Any:
    """Decompress into one bytes object and parse it with orjson, with one-line errors.

    Reading the whole file and decompressing in one call is the fastest path and costs
    the decompressed size once; the bytes are released as soon as orjson is done.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    if not data[:4096].strip() and not data.strip():
        raise TraceError(f"{path}: empty file")
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


def _looks_truncated(data: bytes, exc: orjson.JSONDecodeError) -> bool:
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


# -- columns ---------------------------------------------------------------------------


def _ints(values: list, default: int = -1) -> np.ndarray:
    """A list from JSON -> int64, tolerating None/str/float entries (rare, but seen)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        num = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        return num.fillna(default).to_numpy(dtype=np.float64).astype(np.int64)


def _floats(values: list) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(
            dtype=np.float64
        )


def _us_to_ns(values: list) -> np.ndarray:
    """Microseconds (int or float) -> int64 ns without losing what float64 holds.

    ``ts_us * 1000`` in float64 would round epoch timestamps (~1.7e18 ns) to 256 ns;
    splitting integer and fractional microseconds keeps them exact.
    """
    us = _floats(values)
    us = np.nan_to_num(us, nan=0.0)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _stable_ids(values: list) -> np.ndarray:
    """pid/tid -> int64; numeric strings keep their number, other strings get a stable
    negative id (crc32), so the same thread gets the same id in every file."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    lookup: dict[Any, int] = {}
    for v in set(values):
        if isinstance(v, bool):
            lookup[v] = int(v)
        elif isinstance(v, int):
            lookup[v] = v
        elif isinstance(v, float) and v.is_integer():
            lookup[v] = int(v)
        else:
            s = str(v).strip()
            if s.lstrip("-").isdigit():
                lookup[v] = int(s)
            else:
                lookup[v] = -1 - zlib.crc32(s.encode())
    return np.fromiter((lookup[v] for v in values), dtype=np.int64, count=len(values))


def _categories(raw: list) -> pd.Categorical:
    """Raw 'cat' strings -> the normalised categorical, mapping the few distinct values."""
    codes, uniques = pd.factorize(pd.Series(raw, dtype=object), use_na_sentinel=True)
    remap = np.array(
        [CATEGORIES.index(_CAT_MAP.get(str(u), "other")) for u in uniques]
        + [CATEGORIES.index("other")],
        dtype=np.int8,
    )
    return pd.Categorical.from_codes(remap[codes], categories=CATEGORIES)


def _field(xs: list[dict], key: str, default: Any) -> list:
    """One field of every event; subscripting is ~2x faster than .get, and Kineto
    writes the core fields on every complete event, so .get is only the fallback."""
    try:
        return [e[key] for e in xs]
    except KeyError:
        return [e.get(key, default) for e in xs]


def _complete_events(xs: list[dict], rank: int) -> pd.DataFrame:
    """Columns of the 'X' events of one file (see Trace.events), sorted by (ts, -dur).

    Sorting longer-first at equal start puts a parent before its children, which the
    nesting analyses (self time) rely on. Device-only args are read from device
    events only, which saves most of the dict lookups on host-heavy traces.
    """
    n = len(xs)
    cat = _categories(_field(xs, "cat", None))
    names = pd.Categorical(_field(xs, "name", ""))
    ts = _us_to_ns(_field(xs, "ts", 0))
    dur = np.maximum(_us_to_ns(_field(xs, "dur", 0)), 0)
    pid = _stable_ids(_field(xs, "pid", -1))
    tid = _stable_ids(_field(xs, "tid", -1))
    args = [e.get("args") or _EMPTY for e in xs]
    correlation = _ints([a.get("correlation", -1) for a in args])
    external = _ints(
        [a["External id"] if "External id" in a else a.get("external id", -1) for a in args]
    )

    on_device = np.isin(cat.codes, [CATEGORIES.index(c) for c in DEVICE_CATEGORIES])
    dev = np.flatnonzero(on_device)
    dargs = [args[i] for i in dev.tolist()]
    del args
    stream = np.full(n, -1, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    bps = np.full(n, np.nan, dtype=np.float32)
    occ = np.full(n, np.nan, dtype=np.float32)
    if len(dev):
        stream[dev] = _ints([a.get("stream", -1) for a in dargs])
        device[dev] = _ints([a.get("device", -1) for a in dargs])
        bps[dev] = _floats([a.get("blocks per SM", np.nan) for a in dargs])
        occ[dev] = _floats([a.get("est. achieved occupancy %", np.nan) for a in dargs])
    del dargs

    order = np.lexsort((-dur, ts))
    ts, dur = ts[order], dur[order]
    return pd.DataFrame(
        {
            "rank": np.full(n, rank, dtype=np.int16),
            "pid": pid[order],
            "tid": tid[order],
            "cat": cat[order],
            "name": names[order],
            "ts": ts,
            "dur": dur,
            "end": ts + dur,
            "on_device": on_device[order],
            "correlation": correlation[order],
            "external_id": external[order],
            "stream": stream[order],
            "device": device[order],
            "blocks_per_sm": bps[order],
            "occupancy": occ[order],
        }
    )


def _memory_events(mem: list[dict], rank: int) -> pd.DataFrame:
    """'[memory]' instants; totals absent in old traces are -1 (use the cumulative bytes)."""
    args = [e.get("args") or _EMPTY for e in mem]
    df = pd.DataFrame(
        {
            "rank": np.full(len(mem), rank, dtype=np.int16),
            "ts": _us_to_ns([e.get("ts", 0) for e in mem]),
            "device_type": _ints([a.get("Device Type", -1) for a in args]),
            "device_id": _ints([a.get("Device Id", -1) for a in args]),
            "bytes": _ints([a.get("Bytes", 0) for a in args], default=0),
            "total_allocated": _ints([a.get("Total Allocated", -1) for a in args]),
            "total_reserved": _ints([a.get("Total Reserved", -1) for a in args]),
        }
    )
    return df.sort_values("ts", kind="stable", ignore_index=True)


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


def _load_one(path: Path, index: int) -> tuple[int, pd.DataFrame, pd.DataFrame, dict]:
    doc = read_json(path)
    events, meta = _event_list(path, doc)
    del doc
    xs = [e for e in events if e.get("ph") == "X"]
    mem = [e for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    del events
    if not xs:
        raise TraceError(f"{path}: trace has no complete ('X') events")
    dist = meta.get("distributedInfo")
    rank = index
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        rank = dist["rank"]
    ev = _complete_events(xs, rank)
    del xs
    memory = _memory_events(mem, rank)
    info = {
        "path": str(path),
        "deviceProperties": meta.get("deviceProperties") or [],
        "distributedInfo": dist or {},
        "schemaVersion": meta.get("schemaVersion"),
        "displayTimeUnit": meta.get("displayTimeUnit"),
        "baseTimeNanoseconds": meta.get("baseTimeNanoseconds"),
    }
    return rank, ev, memory, info


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate per-rank frames keeping 'name' categorical (plain concat makes it object)."""
    if len(frames) == 1:
        return frames[0]
    names = union_categoricals([f["name"] for f in frames], ignore_order=True)
    out = pd.concat([f.drop(columns="name") for f in frames], ignore_index=True)
    out.insert(out.columns.get_loc("cat") + 1, "name", names)
    return out


def load_trace(paths: str | Path | Sequence[str | Path]) -> Trace:
    """Load one or more trace files (one per rank) into one ``Trace``.

    A folder stands for every *.json / *.json.gz in it. The rank of a file is its
    ``distributedInfo.rank``, else its position in the list; two files claiming the
    same rank fall back to positions, with a warning.
    """
    files = trace_files(paths)
    loaded = [_load_one(p, i) for i, p in enumerate(files)]
    warnings: list[str] = []
    ranks = [r for r, *_ in loaded]
    if len(set(ranks)) != len(ranks):
        warnings.append(
            "several files claim the same distributedInfo.rank; ranks are file positions"
        )
        for i, (_, ev, mem, _info) in enumerate(loaded):
            ev["rank"] = np.int16(i)
            mem["rank"] = np.int16(i)
        loaded = [(i, *rest) for i, (_, *rest) in enumerate(loaded)]
    loaded.sort(key=lambda t: t[0])

    step_frames = []
    for rank, ev, _mem, info in loaded:
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

    events = _concat([ev for _, ev, _, _ in loaded])
    memory = pd.concat([m for _, _, m, _ in loaded], ignore_index=True)
    steps = pd.concat(step_frames, ignore_index=True)
    meta = {rank: info for rank, _, _, info in loaded}
    return Trace(
        events=events,
        memory=memory,
        steps=steps,
        ranks=[r for r, *_ in loaded],
        meta=meta,
        warnings=warnings,
        has_device=bool(events["on_device"].any()),
    )
