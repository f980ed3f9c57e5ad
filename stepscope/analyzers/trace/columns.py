"""Kineto events -> the columns of ``Trace.events`` and ``Trace.memory``.

The parsed JSON of a trace is a list of millions of small dicts; everything here turns
such a list into NumPy/pandas columns in as few passes over the dicts as it can
(C-level ``itemgetter``, ``zip``, ``compress``), because visiting the dicts is what
loading a trace costs. The category vocabulary lives here too: the raw 'cat' strings
of every Kineto (and tb-profiler era) version are normalised to ``CATEGORIES``.
Times are int64 nanoseconds (see ``trace.load``). The same pass keeps the shape args of
the few operators the FLOP counting reads (``op_args``), so nothing parses a file twice.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import attrgetter, eq, itemgetter
from typing import Any

import numpy as np
import orjson
import pandas as pd

from stepscope.analyzers.trace.typed_events import NO_ARGS, Event, shape

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


def us_to_ns(values: Sequence) -> np.ndarray:
    """Microseconds (int or float) -> int64 ns without losing what float64 holds.

    ``ts_us * 1000`` in float64 would round epoch timestamps (~1.7e18 ns) to 256 ns;
    splitting integer and fractional microseconds keeps them exact.
    """
    us = _floats(values)
    us = np.nan_to_num(us, nan=0.0)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def stable_ids(values: Sequence) -> np.ndarray:
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
_MEMORY_FIELDS = (
    "Device Type",
    "Device Id",
    "Bytes",
    "Total Allocated",
    "Total Reserved",
    "Addr",
)
_MEMORY_DEFAULTS = (-1, -1, 0, -1, -1, -1)
#: the same fields of a typed event's args (``typed_events.Args``)
_MEMORY_ATTRIBUTES = (
    "device_type",
    "device_id",
    "nbytes",
    "total_allocated",
    "total_reserved",
    "addr",
)
_DEVICE_CODES = [CATEGORIES.index(c) for c in DEVICE_CATEGORIES]
#: Categories whose args are not read for 'correlation' (in Kineto only CUDA runtime /
#: driver and device events carry one) or for 'External id' (Python tracer events carry
#: 'Python id' instead); skipping them saves the lookups on the most numerous host
#: events. Their column value is -1, as it would be for a missing arg.
_NO_CORRELATION = [CATEGORIES.index(c) for c in ("cpu_op", "user_annotation", "python_function")]
_NO_EXTERNAL = [CATEGORIES.index("python_function")]
_CPU_OP = CATEGORIES.index("cpu_op")
#: The operator args a FLOP formula reads: the first three go into ``Trace.op_args``'s
#: ``args`` column (as one JSON array), the sequence number into ``seq``.
_OP_ARG_FIELDS = ("Input Dims", "Input type", "Concrete Inputs", "Sequence number")


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


def _rows_except(codes: np.ndarray, skip: list[int]) -> np.ndarray | None:
    """Rows whose category is not in ``skip``; None (meaning every row) when that is all."""
    keep = ~np.isin(codes, skip)
    return None if keep.all() else np.flatnonzero(keep)


def _spread(values: list, rows: np.ndarray | None, n: int, convert: Callable) -> np.ndarray:
    """``values`` of ``rows`` (all when None) into a column of ``n``; others get -1."""
    if rows is None:
        return convert(values)
    out = np.full(n, -1, dtype=np.int64)
    out[rows] = convert(values)
    return out


class DictArgs:
    """The ``args`` of events parsed as dicts (orjson): the reading of any trace."""

    def __init__(self, args: tuple) -> None:
        self.args = _dicts(args)

    def pick(self, rows: np.ndarray | None) -> Sequence[dict]:
        return self.args if rows is None else list(map(self.args.__getitem__, rows.tolist()))

    def ints(self, rows: np.ndarray | None, key: str) -> np.ndarray:
        """One int64 column of ``key`` from the args of ``rows`` (all when None); -1
        elsewhere and where absent. A C-level itemgetter first (Kineto writes the key on
        every event of the categories asked), ``.get`` with the default where it is not."""
        sub = self.pick(rows)
        try:
            values = list(map(itemgetter(key), sub))
        except KeyError:
            values = [a.get(key, -1) for a in sub]
        return _spread(values, rows, len(self.args), _ints)

    def externals(self, rows: np.ndarray | None) -> np.ndarray:
        sub = self.pick(rows)
        try:
            values = list(map(itemgetter("External id"), sub))
        except KeyError:  # old (tb-profiler era) traces spell it in lower case
            values = [
                a["External id"] if "External id" in a else a.get("external id", -1) for a in sub
            ]
        return _spread(values, rows, len(self.args), _ints)

    def device_fields(self, rows: np.ndarray) -> tuple[list, list, list, list]:
        """stream, device, blocks per SM, occupancy of the device events ``rows``."""
        sub = self.pick(rows)
        return (
            [a.get("stream", -1) for a in sub],
            [a.get("device", -1) for a in sub],
            [a.get("blocks per SM", np.nan) for a in sub],
            [a.get("est. achieved occupancy %", np.nan) for a in sub],
        )

    def op_fields(self, rows: np.ndarray) -> tuple[list, list, list, list]:
        """Input Dims, Input type, Concrete Inputs (None where absent), Sequence number."""
        sub = self.pick(rows)
        return tuple(list(map(dict.get, sub, repeat(k))) for k in _OP_ARG_FIELDS)  # type: ignore[return-value]


class TypedArgs:
    """The ``args`` of events decoded as typed records (``typed_events``)."""

    def __init__(self, args: tuple) -> None:
        self.args = tuple(NO_ARGS if a is None else a for a in args)

    def pick(self, rows: np.ndarray | None) -> Sequence[Any]:
        return self.args if rows is None else list(map(self.args.__getitem__, rows.tolist()))

    def ints(self, rows: np.ndarray | None, key: str) -> np.ndarray:
        values = list(map(attrgetter(key), self.pick(rows)))
        return _spread(values, rows, len(self.args), _ints)

    def externals(self, rows: np.ndarray | None) -> np.ndarray:
        values = [a.external() for a in self.pick(rows)]
        return _spread(values, rows, len(self.args), _ints)

    def device_fields(self, rows: np.ndarray) -> tuple[list, list, list, list]:
        sub = self.pick(rows)
        get = attrgetter("stream", "device", "blocks_per_sm", "occupancy")
        columns = tuple(map(list, zip(*map(get, sub), strict=True)))
        return columns if columns else ([], [], [], [])  # type: ignore[return-value]

    def op_fields(self, rows: np.ndarray) -> tuple[list, list, list, list]:
        sub = self.pick(rows)
        return (
            [shape(a.input_dims) for a in sub],
            [shape(a.input_type) for a in sub],
            [shape(a.concrete_inputs) for a in sub],
            [a.sequence_number for a in sub],
        )


def op_args(
    args: DictArgs | TypedArgs,
    cat: pd.Categorical,
    names: pd.Categorical,
    keep: Callable[[Any], bool] | None,
    position: np.ndarray,
) -> pd.DataFrame:
    """The FLOP args of the cpu_op events whose name ``keep`` accepts, in file order:
    ``row`` (``position`` maps a file index to the sorted row), ``name``, ``args`` and
    ``seq`` (see ``Trace.op_args``).

    ``keep`` is asked once per distinct name, and only the accepted events' args are
    visited (a few % of them). Shapes, dtypes and concrete args are kept as the JSON
    bytes of ``[dims, types, concrete]``, not as the parsed lists: kept lists would
    survive the paused collector as tens of thousands of young objects, and its first
    pass after loading walked them all (10-14 ms on the 45 k event ResNet trace, +7 %
    load time, and they stay in every full pass); serialising walks them once, just
    before the parsed JSON they sit in is freed (+1 %). And equal bytes are equal calls,
    which the FLOP counting evaluates once.
    """
    rows = np.empty(0, dtype=np.int64)
    if keep is not None and len(names.categories):
        wanted = np.fromiter(map(keep, names.categories), dtype=bool, count=len(names.categories))
        codes = names.codes
        rows = np.flatnonzero(wanted[codes] & (codes >= 0) & (cat.codes == _CPU_OP))
    dims, types, concrete, seq = args.op_fields(rows)
    name = map(list(names.categories).__getitem__, names.codes[rows].tolist())
    # Nothing kept may point into the parsed JSON, nor be one of many small new objects:
    # each survivor pins the 256 kB arena it sits in after the parsed JSON is freed (on
    # a 1 M-event trace, +200 MB of peak memory). Equal calls share one bytes object,
    # and sequence numbers are copied into an int64 column (-1: none).
    shared: dict[bytes, bytes] = {}
    blobs = (
        shared.setdefault(b, b) for b in map(orjson.dumps, zip(dims, types, concrete, strict=True))
    )
    columns = {"row": position[rows]}  # object arrays by fromiter: no shape inference
    for column, values in (("name", name), ("args", blobs)):
        columns[column] = np.fromiter(values, dtype=object, count=len(rows))
    columns["seq"] = _ints([s if type(s) is int else -1 for s in seq])
    return pd.DataFrame(columns, copy=False)


def complete_events(
    xs: list[dict], rank: int, keep_args: Callable[[Any], bool] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Columns of the 'X' events of one file (see Trace.events), sorted by (ts, -dur),
    and the ``op_args`` of the operators whose name ``keep_args`` accepts.

    Sorting longer-first at equal start puts a parent before its children, which the
    nesting analyses (self time) rely on. Args are read only from the categories that
    carry each field (device-only args from device events), which saves most of the
    dict lookups on host-heavy traces.
    """
    n = len(xs)
    typed = type(xs[0]) is Event
    if typed:
        get = attrgetter(*_CORE_FIELDS)
        fields = tuple(zip(*map(get, xs), strict=True))
    else:
        fields = _columns(xs, _CORE_FIELDS, _CORE_DEFAULTS)
    cat_raw, name_raw, ts_raw, dur_raw, pid_raw, tid_raw, raw_args = fields
    del fields
    cat = _categories(cat_raw)
    names = _names(name_raw)
    ts = us_to_ns(ts_raw)
    dur = np.maximum(us_to_ns(dur_raw), 0)
    pid = stable_ids(pid_raw)
    tid = stable_ids(tid_raw)
    del cat_raw, name_raw, ts_raw, dur_raw, pid_raw, tid_raw
    args = TypedArgs(raw_args) if typed else DictArgs(raw_args)
    del raw_args

    codes = cat.codes
    correlation = args.ints(_rows_except(codes, _NO_CORRELATION), "correlation")
    external = args.externals(_rows_except(codes, _NO_EXTERNAL))

    on_device = np.isin(codes, _DEVICE_CODES)
    dev = np.flatnonzero(on_device)
    stream = np.full(n, -1, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    bps = np.full(n, np.nan, dtype=np.float32)
    occ = np.full(n, np.nan, dtype=np.float32)
    if len(dev):
        streams, devices, blocks, occupancy = args.device_fields(dev)
        stream[dev] = _ints(streams)
        device[dev] = _ints(devices)
        bps[dev] = _floats(blocks)
        occ[dev] = _floats(occupancy)
        del streams, devices, blocks, occupancy

    order = np.lexsort((-dur, ts))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    kept = op_args(args, cat, names, keep_args, position)
    del args
    ts, dur = ts[order], dur[order]
    events = pd.DataFrame(
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
    return events, kept


def memory_events(mem: list, rank: int) -> pd.DataFrame:
    """'[memory]' instants; totals absent in old traces are -1 (use the cumulative bytes)."""
    if mem and type(mem[0]) is Event:
        ts_raw = tuple(e.ts for e in mem)
        tid = tuple(e.tid for e in mem)
        get = attrgetter(*_MEMORY_ATTRIBUTES)
        columns = tuple(zip(*(get(e.args or NO_ARGS) for e in mem), strict=True))
    else:
        ts_raw, tid, args = _columns(mem, ("ts", "tid", "args"), (0, -1, None))
        columns = _columns(_dicts(args), _MEMORY_FIELDS, _MEMORY_DEFAULTS)
    dev_type, dev_id, nbytes, total_alloc, total_res, addr = columns or ((),) * 6
    df = pd.DataFrame(
        {
            "rank": np.full(len(mem), rank, dtype=np.int16),
            "ts": us_to_ns(ts_raw),
            "device_type": _ints(dev_type),
            "device_id": _ints(dev_id),
            "bytes": _ints(nbytes, default=0),
            "total_allocated": _ints(total_alloc),
            "total_reserved": _ints(total_res),
            # the block's address and the thread that asked: which allocations are
            # live at the peak, and inside which module (analyzers/trace/memory_peak.py)
            "addr": _ints(addr),
            "tid": _ints(tid),
        }
    )
    return df.sort_values("ts", kind="stable", ignore_index=True)


def split_events(events: list) -> tuple[list, list]:
    """The complete ('X') events and the '[memory]' instants, in file order (dicts, or
    ``typed_events.Event`` records).

    'ph' is read once per event (C-level itemgetter) and both selections are C-level
    ``compress`` passes, instead of two Python-level scans calling ``.get``.
    """
    typed = bool(events) and type(events[0]) is Event
    if typed:
        phs = list(map(attrgetter("ph"), events))
    else:
        try:
            phs = list(map(itemgetter("ph"), events))
        except (KeyError, TypeError):
            phs = [e.get("ph") if isinstance(e, dict) else None for e in events]
    xs = list(compress(events, map(eq, phs, repeat("X"))))
    instants = compress(events, map(eq, phs, repeat("i")))
    del phs
    if typed:
        mem = [e for e in instants if e.name == "[memory]"]
    else:
        mem = [e for e in instants if e.get("name") == "[memory]"]
    return xs, mem
