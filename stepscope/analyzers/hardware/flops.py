"""FLOPs and bytes of each CPU operator, from the shapes a capture records.

A capture made with ``record_shapes=True`` writes each operator's argument shapes
("Input Dims"), dtypes ("Input type") and, since torch 2.1, its scalar and list
arguments ("Concrete Inputs"). The loader keeps these args for the operators that have
a formula (``Trace.op_args``); their nesting and times come from ``Trace.events``.

Counting each operation once: operators nest (``aten::linear`` -> ``aten::addmm``;
``aten::conv2d`` -> ``aten::convolution`` -> ``aten::_convolution`` -> backend op;
``aten::relu_`` -> ``aten::clamp_min_``). On each thread the outermost operator with a
formula is counted and everything inside it is skipped. The formulas sit where torch's
``FlopCounterMode`` counts (mm/addmm/bmm/baddbmm, convolution, convolution_backward,
the sdpa kernels); the composites above (linear, matmul, conv2d,
scaled_dot_product_attention) have none, so their children count, as in
``FlopCounterMode`` after decomposition. An op whose shapes do not determine its count
is left out, never guessed, and so are its children; ``ops.attrs["skipped"]`` counts
them per name.

The formulas, per operator, are in ``flop_formulas.py``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson
import pandas as pd

from stepscope.analyzers.hardware.flop_formulas import FORMULAS, OpCall, op_flops
from stepscope.analyzers.trace import flop_ops, load

COLUMNS = ["rank", "step", "tid", "name", "ts", "dur_ns", "self_ns"]
COLUMNS += ["flops", "bytes", "dtype", "basis"]


def _nesting(ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per event row: counted, self time (ns), parent row (-1: none), over cpu_op rows.

    In NumPy: thread by thread in the events' (ts, -dur) order, an op's depth is the
    number of ops open at its start (a sweep; an end before a later start at the same
    time, as a stack pops it), its parent the last op one level up; an op with a formula
    counts iff it starts at or after the end of every earlier one (none encloses it).
    The old stack walk's results on every shared trace (tests pin them)."""
    cpu = np.flatnonzero((ev["cat"] == "cpu_op").to_numpy())
    rows = cpu[np.lexsort([ev[c].to_numpy()[cpu] for c in ("tid", "pid", "rank")])]  # stable
    cols = ("rank", "pid", "tid", "ts", "dur", "end")
    rank, pid, tid, ts, dur, end = (ev[c].to_numpy()[rows] for c in cols)
    m = len(rows)
    first = np.ones(m, dtype=bool)  # the first op of its thread
    first[1:] = (rank[1:] != rank[:-1]) | (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    thread, k = np.cumsum(first) - 1, np.arange(m, dtype=np.int64)
    sweep = np.lexsort((np.r_[2 * k, 2 * k + 1], np.r_[ts, end], np.r_[thread, thread]))
    starts = sweep < m
    depth = np.zeros(m, dtype=np.int64)
    depth[sweep[starts]] = np.cumsum(np.where(starts, 1, -1))[starts] - 1
    level = thread * (int(depth.max(initial=0)) + 2) + depth  # (thread, depth), ordered
    keys = np.sort(level * m + k)
    pos = np.searchsorted(keys, (level - 1) * m + k) - 1  # the last one a level up
    found = keys[np.maximum(pos, 0)]
    has = (depth > 0) & (pos >= 0) & (found // max(m, 1) == level - 1)
    parent = found % max(m, 1)
    kids_ns = np.bincount(parent[has], weights=dur[has], minlength=m)  # exact below 2**53
    names = ev["name"].cat
    with_formula = np.append(names.categories.isin(list(FORMULAS)), False)
    formula = with_formula[names.codes.to_numpy()[rows]]  # code -1 (no name): the False
    low = np.iinfo(np.int64).min
    ends = pd.Series(np.where(formula, end, low)).groupby(thread).cummax().to_numpy()
    before = np.where(first, low, np.roll(ends, 1))  # the latest end of the earlier ones
    n = len(ev)
    counted, self_ns, parents = np.zeros(n, bool), np.zeros(n, np.int64), np.full(n, -1)
    counted[rows] = formula & (ts >= before)
    self_ns[rows] = np.maximum(dur - kids_ns.astype(np.int64), 0)
    parents[rows[has]] = rows[parent[has]]
    return counted, self_ns, parents


def _conv_outputs(args: pd.DataFrame, ranks: np.ndarray) -> dict[tuple[int, int], bytes]:
    """(rank, sequence number) -> output shape (JSON) from conv autograd nodes, whose
    input is the output's gradient (the last in file order wins), for old traces."""
    out: dict[tuple[int, int], bytes] = {}
    at = np.flatnonzero(~args["name"].isin(list(FORMULAS)).to_numpy())  # autograd nodes
    nodes = (args[c].take(at).tolist() for c in ("name", "args", "seq"))
    for rank, name, blob, seq in zip(ranks[at].tolist(), *nodes, strict=True):
        dims = orjson.loads(blob)[0] if flop_ops.is_conv_node(name) else None
        shape = dims[0] if isinstance(dims, list) and dims else None
        if seq >= 0 and isinstance(shape, list) and shape:
            out[rank, seq] = orjson.dumps(shape)
    return out


def _evaluate(keys: list[tuple]) -> list[tuple | None]:
    """(flops, bytes, dtype, basis) or None per call key (name, args JSON, output shape
    JSON, children): the formula runs once per distinct key, as steps repeat calls."""
    out: dict[tuple, tuple | None] = {}
    for key in dict.fromkeys(keys):
        name, blob, shape, kids = key
        dims, types, concrete = orjson.loads(blob)
        shape = shape and orjson.loads(shape)
        call = OpCall(name, dims, types or [], concrete, list(kids or ()), shape)
        got = op_flops(call)
        out[key] = None if got is None else (*got[:2], call.tensors()[0][2], got[2])
    return list(map(out.__getitem__, keys))


def operator_flops(trace: load.Trace) -> pd.DataFrame:
    """One row per counted CPU operator event: ``rank, step, tid, name, ts, dur_ns,
    self_ns, flops, bytes, dtype, basis`` (times in ns, as ``Trace.events``).

    From ``Trace.events`` and the args the loader kept (``Trace.op_args``; a Trace
    without them, not from ``load_trace``, raises ValueError); the counting rules are
    in the module docstring. A call's key holds the conv's output shape and children
    only where its formula reads them. ``step`` is -1 outside every ProfilerStep;
    ``self_ns``: the duration minus the direct child operators'. ``attrs["skipped"]``:
    the names with a formula but no usable shapes (no ``record_shapes``), and counts.
    """
    if trace.op_args is None:
        raise ValueError("operator_flops needs Trace.op_args: load the trace with load_trace")
    ev, args = trace.events, trace.op_args
    counted, self_ns, parents = _nesting(ev)
    conv_out = _conv_outputs(args, ev["rank"].to_numpy()[args["row"].to_numpy()])
    args = args[counted[args["row"].to_numpy()]]  # in (rank, file order), as before
    rows, names = args["row"].to_numpy(), args["name"].tolist()
    basis = np.array([FORMULAS[n][0] for n in names], dtype=object)
    kids: dict[int, list[str]] = {r: [] for r in rows[basis == "conv_backward"].tolist()}
    cats, codes = ev["name"].cat.categories, ev["name"].cat.codes.to_numpy()
    for i in np.flatnonzero(np.isin(parents, list(kids))).tolist():  # their children
        kids[int(parents[i])].append(str(cats[codes[i]]))
    pairs = zip(ev["rank"].to_numpy()[rows].tolist(), args["seq"].tolist(), basis, strict=True)
    outs = [conv_out.get((r, s)) if b == "conv" else None for r, s, b in pairs]
    kid_names = [tuple(kids[r]) if r in kids else None for r in rows.tolist()]
    got = _evaluate(list(zip(names, args["args"], outs, kid_names, strict=True)))
    skipped = Counter(name for name, g in zip(names, got, strict=True) if g is None)
    good = [(name, *g) for name, g in zip(names, got, strict=True) if g is not None]
    ops = pd.DataFrame([], columns=COLUMNS)  # the empty frame, as it has always been
    if good:
        r = rows[[g is not None for g in got]]
        rank, tid, ts, dur = (ev[c].to_numpy()[r] for c in ("rank", "tid", "ts", "dur"))
        name, *values = map(list, zip(*good, strict=True))
        data = [rank, np.int64(-1), tid, name, ts, dur, self_ns[r], *values]
        ops = pd.DataFrame(dict(zip(COLUMNS, data, strict=True)))
    ops = ops.astype({"rank": "int16", "flops": "int64", "bytes": "int64"})
    ops["step"] = _assign_steps(ops, trace.steps)
    ops = ops.sort_values(["rank", "ts"], ignore_index=True)
    ops.attrs["skipped"] = dict(skipped)
    return ops


def _assign_steps(ops: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The ProfilerStep each op starts in; -1 outside every step."""
    out = np.full(len(ops), -1, dtype=np.int64)
    for rank, st in steps.groupby("rank"):
        st = st.sort_values("start")
        rows = np.flatnonzero(ops["rank"].to_numpy() == rank)
        ts = ops["ts"].to_numpy()[rows]
        j = np.searchsorted(st["start"].to_numpy(), ts, side="right") - 1
        ok = (j >= 0) & (ts < st["end"].to_numpy()[np.maximum(j, 0)])
        out[rows[ok]] = st["step"].to_numpy()[j[ok]]
    return out


def flops_summary(ops: pd.DataFrame) -> pd.DataFrame:
    """Per operator name: count, flops, bytes, total and self time (ns), and FLOPs per
    byte (the arithmetic intensity a roofline places it by); most FLOPs first."""
    g = ops.groupby("name", observed=True)
    out = g.agg(
        basis=("basis", "first"),
        count=("flops", "size"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
        dur_ns=("dur_ns", "sum"),
        self_ns=("self_ns", "sum"),
    )
    out["flops_per_byte"] = out["flops"] / out["bytes"].where(out["bytes"] > 0)
    return out.sort_values(["flops", "bytes"], ascending=False).reset_index()


def flops_per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """FLOPs and bytes of each (rank, step): what MFU divides by the step's time."""
    sums = {"ops": ("flops", "size"), "flops": ("flops", "sum"), "bytes": ("bytes", "sum")}
    return ops.groupby(["rank", "step"], observed=True).agg(**sums).reset_index()
