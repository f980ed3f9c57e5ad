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

import gc
import gzip
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import eq, itemgetter
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


def _ints(values: Sequence, default: int = -1) -> np.ndarray:
    """A list from JSON -> int64, tolerating None/str/float entries (rare, but seen).

    ``np.fromiter`` converts element by element exactly like ``np.asarray`` (same
    errors, same results), but ~1.5x faster, as it never probes for nested sequences.
    """
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        num = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
        return num.fillna(default).to_numpy(dtype=np.float64).astype(np.int64)


def _floats(values: Sequence) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(
            dtype=np.float64
        )


def _us_to_ns(values: Sequence) -> np.ndarray:
    """Microseconds (int or float) -> int64 ns without losing what float64 holds.

    ``ts_us * 1000`` in float64 would round epoch timestamps (~1.7e18 ns) to 256 ns;
    splitting integer and fractional microseconds keeps them exact.
    """
    us = _floats(values)
    us = np.nan_to_num(us, nan=0.0)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _stable_ids(values: Sequence) -> np.ndarray:
    """pid/tid -> int64; numeric strings keep their number, other strings get a stable
    negative id (crc32), so the same thread gets the same id in every file."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
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
    return np.fromiter(map(lookup.__getitem__, values), dtype=np.int64, count=len(values))


#: The fields of a complete event that become columns; one itemgetter call fetches all
#: of them, so each event dict is visited once instead of once per field.
_CORE_FIELDS = ("cat", "name", "ts", "dur", "pid", "tid", "args")
_CORE_DEFAULTS = (None, "", 0, 0, -1, -1, None)
_MEMORY_FIELDS = ("Device Type", "Device Id", "Bytes", "Total Allocated", "Total Reserved")
_MEMORY_DEFAULTS = (-1, -1, 0, -1, -1)
_DEVICE_CODES = [CATEGORIES.index(c) for c in DEVICE_CATEGORIES]
#: Categories whose args are not read for 'correlation' (in Kineto only CUDA runtime /
#: driver and device events carry one) or for 'External id' (Python tracer events carry
#: 'Python id' instead); skipping them saves the lookups on the most numerous host
#: events. Their column value is -1, as it would be for a missing arg.
_NO_CORRELATION = [CATEGORIES.index(c) for c in ("cpu_op", "user_annotation", "python_function")]
_NO_EXTERNAL = [CATEGORIES.index("python_function")]


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


def _columns(rows: Sequence[dict], fields: tuple[str, ...], defaults: tuple) -> tuple[tuple, ...]:
    """Several fields of every dict, one tuple per field, each dict visited once.

    Fetching all fields in one itemgetter pass and transposing with zip is ~2x faster
    than one pass per field (the dicts are scattered in memory, so every visit is a
    cache miss). Kineto writes these fields on nearly every event; when one is missing
    somewhere, per-field ``.get`` with the default is the fallback.
    """
    if not rows:
        return tuple(() for _ in fields)
    try:
        if len(fields) == 1:  # itemgetter of one key returns the value, not a 1-tuple
            return (tuple(map(itemgetter(fields[0]), rows)),)
        return tuple(zip(*map(itemgetter(*fields), rows), strict=True))
    except KeyError:
        return tuple(
            tuple(r.get(k, d) for r in rows) for k, d in zip(fields, defaults, strict=True)
        )


def _intern(values: Sequence) -> tuple[np.ndarray, list]:
    """Codes (int32) and the distinct values in first-seen order.

    Two C-level dict passes (``dict.fromkeys``, then ``map`` of lookups) beat
    ``pd.factorize`` / ``pd.Categorical`` on a list, which first convert the whole list
    to an array of objects (or of pyarrow strings).
    """
    seen: dict[Any, Any] = dict.fromkeys(values)
    for i, v in enumerate(seen):
        seen[v] = i
    codes = np.fromiter(map(seen.__getitem__, values), dtype=np.int32, count=len(values))
    return codes, list(seen)


def _categories(raw: Sequence) -> pd.Categorical:
    """Raw 'cat' strings -> the normalised categorical, mapping the few distinct values."""
    codes, uniques = _intern(raw)
    remap = np.array(
        [CATEGORIES.index(_CAT_MAP.get(str(u), "other")) for u in uniques], dtype=np.int8
    )
    return pd.Categorical.from_codes(remap[codes], categories=CATEGORIES, validate=False)


def _names(raw: Sequence) -> pd.Categorical:
    """Event names -> a categorical with sorted categories, exactly as ``pd.Categorical``.

    Sorting only the distinct names and remapping the codes avoids converting and
    factorizing an array of every name; non-string names (never seen in Kineto traces,
    but JSON allows them) take pandas' own path, so the result is the same.
    """
    codes, uniques = _intern(raw)
    if not all(type(u) is str for u in uniques):
        return pd.Categorical(list(raw))
    order = sorted(range(len(uniques)), key=uniques.__getitem__)
    position = np.empty(len(order), dtype=np.int32)
    position[order] = np.arange(len(order), dtype=np.int32)
    categories = pd.Index([uniques[i] for i in order])
    return pd.Categorical.from_codes(position[codes], categories=categories, validate=False)


def _dicts(args: tuple) -> tuple:
    """'args' values with anything but a dict (a missing or null 'args') as ``{}``."""
    if set(map(type, args)) <= {dict}:
        return args
    return tuple(a if isinstance(a, dict) else _EMPTY for a in args)


def _arg_column(
    args: Sequence[dict],
    rows: np.ndarray | None,
    key: str,
    fallback: Callable[[Sequence[dict]], list],
) -> np.ndarray:
    """One int64 column from the args of ``rows`` (all events when None); others get -1.

    ``key`` is tried on every selected event with a C-level itemgetter first (Kineto
    writes it on all of them); ``fallback`` reads the selected args with defaults.
    """
    sub = args if rows is None else list(map(args.__getitem__, rows.tolist()))
    try:
        values = list(map(itemgetter(key), sub))
    except KeyError:
        values = fallback(sub)
    if rows is None:
        return _ints(values)
    out = np.full(len(args), -1, dtype=np.int64)
    out[rows] = _ints(values)
    return out


def _rows_except(codes: np.ndarray, skip: list[int]) -> np.ndarray | None:
    """Rows whose category is not in ``skip``; None (meaning every row) when that is all."""
    keep = ~np.isin(codes, skip)
    return None if keep.all() else np.flatnonzero(keep)


def _correlations(args: Sequence[dict]) -> list:
    return [a.get("correlation", -1) for a in args]


def _externals(args: Sequence[dict]) -> list:
    # old (tb-profiler era) traces spell it in lower case
    return [a["External id"] if "External id" in a else a.get("external id", -1) for a in args]


def _complete_events(xs: list[dict], rank: int) -> pd.DataFrame:
    """Columns of the 'X' events of one file (see Trace.events), sorted by (ts, -dur).

    Sorting longer-first at equal start puts a parent before its children, which the
    nesting analyses (self time) rely on. Args are read only from the categories that
    carry each field (device-only args from device events), which saves most of the
    dict lookups on host-heavy traces.
    """
    n = len(xs)
    cat_raw, name_raw, ts_raw, dur_raw, pid_raw, tid_raw, args = _columns(
        xs, _CORE_FIELDS, _CORE_DEFAULTS
    )
    cat = _categories(cat_raw)
    names = _names(name_raw)
    ts = _us_to_ns(ts_raw)
    dur = np.maximum(_us_to_ns(dur_raw), 0)
    pid = _stable_ids(pid_raw)
    tid = _stable_ids(tid_raw)
    del cat_raw, name_raw, ts_raw, dur_raw, pid_raw, tid_raw
    args = _dicts(args)

    codes = cat.codes
    correlation = _arg_column(
        args, _rows_except(codes, _NO_CORRELATION), "correlation", _correlations
    )
    external = _arg_column(args, _rows_except(codes, _NO_EXTERNAL), "External id", _externals)

    on_device = np.isin(codes, _DEVICE_CODES)
    dev = np.flatnonzero(on_device)
    stream = np.full(n, -1, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    bps = np.full(n, np.nan, dtype=np.float32)
    occ = np.full(n, np.nan, dtype=np.float32)
    if len(dev):
        dargs = list(map(args.__getitem__, dev.tolist()))
        stream[dev] = _ints([a.get("stream", -1) for a in dargs])
        device[dev] = _ints([a.get("device", -1) for a in dargs])
        bps[dev] = _floats([a.get("blocks per SM", np.nan) for a in dargs])
        occ[dev] = _floats([a.get("est. achieved occupancy %", np.nan) for a in dargs])
        del dargs
    del args

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
        },
        copy=False,  # fresh arrays: no copy, and no consolidating them into 2-D blocks
    )


def _memory_events(mem: list[dict], rank: int) -> pd.DataFrame:
    """'[memory]' instants; totals absent in old traces are -1 (use the cumulative bytes)."""
    ts_raw, args = _columns(mem, ("ts", "args"), (0, None))
    args = _dicts(args)
    dev_type, dev_id, nbytes, total_alloc, total_res = _columns(
        args, _MEMORY_FIELDS, _MEMORY_DEFAULTS
    )
    df = pd.DataFrame(
        {
            "rank": np.full(len(mem), rank, dtype=np.int16),
            "ts": _us_to_ns(ts_raw),
            "device_type": _ints(dev_type),
            "device_id": _ints(dev_id),
            "bytes": _ints(nbytes, default=0),
            "total_allocated": _ints(total_alloc),
            "total_reserved": _ints(total_res),
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


def _split(events: list) -> tuple[list[dict], list[dict]]:
    """The complete ('X') events and the '[memory]' instants, in file order.

    'ph' is read once per event (C-level itemgetter) and both selections are C-level
    ``compress`` passes, instead of two Python-level scans calling ``.get``.
    """
    try:
        phs = list(map(itemgetter("ph"), events))
    except (KeyError, TypeError):
        phs = [e.get("ph") if isinstance(e, dict) else None for e in events]
    xs = list(compress(events, map(eq, phs, repeat("X"))))
    instants = compress(events, map(eq, phs, repeat("i")))
    del phs
    mem = [e for e in instants if e.get("name") == "[memory]"]
    return xs, mem


def _load_one(path: Path, index: int) -> tuple[int, pd.DataFrame, pd.DataFrame, dict]:
    doc = read_json(path)
    events, meta = _event_list(path, doc)
    del doc
    xs, mem = _split(events)
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
    with _gc_paused():
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
