"""The phases of a training step: data wait, forward, backward, optimizer step, exposed
communication, host-device sync, other.

The step-time breakdown (``breakdown.py``) says what kind of work filled a step
("elementwise kernels 57 %"); a user acts on where in the step it happened ("optimizer
step 33 %": fuse the optimizer). Both use priority segmentation (``priority.py``): the
time line is cut at every range edge and each instant goes to the highest-priority
role active then, so the phases of a step add up to its wall time exactly.

Where the phases come from (the trace's own annotations, checked on the shared GPU
traces and on torch 2.13 CPU captures with ``record_shapes`` and ``with_stack``):

* data wait: the DataLoader's ``enumerate(DataLoader)#...__next__`` ranges (the rule of
  ``breakdown.role_masks``, tb-profiler's).
* forward: every other CPU operator and runtime call, and with the Python tracer
  (``with_stack``) the ``nn.Module: X`` call ranges, so the Python between a module's
  operators is forward too. User annotations are region labels, not work: one counts
  only where named here, or, at the lowest priority (filling its thread's gaps), when
  its name holds the word backward, optimizer/optim/zero_grad or forward (HTA's test
  traces' ``## backward ##``, ``DistributedDataParallel.forward``, Lightning
  profiler's ``...optimizer_step``). An unnamed annotation counting as forward would
  turn the backward's gaps into forward: ``## backward ##`` spans the main thread's
  wait while the engine's thread runs the backward.
* backward: the autograd engine's ranges (``autograd::engine::evaluate_function: ...``;
  ``NllLossBackward``-style ``...Backward`` and ``torch::autograd::...`` ranges in
  2021 traces, which lack the wrapper), every operator of a thread that runs backward
  ranges but holds no ``ProfilerStep#`` (the engine's device thread: on GPU traces the
  backward runs there, while on the CPU it runs on the calling thread), and with the
  Python tracer the ``torch/autograd/__init__.py(N): backward`` / ``torch/_tensor.py(N):
  backward`` call (the engine's own time between its functions).
* optimizer step: ``Optimizer.step#...`` (the range torch.optim's step hook records,
  Python loop included) and ``Optimizer.zero_grad#...``, minus any closure run inside
  the step. A closure (Lightning's ``optimizer.step(closure)``, LBFGS) is found by
  backward work starting inside the ``Optimizer.step#`` range: the span from the step's
  start to the end of its last backward range is the closure's, and in it operators
  count as forward and backward as usual, gaps as other, and only ``zero_grad`` as
  optimizer. The optimizer's own work after the closure stays optimizer. (LBFGS calls
  the closure several times: its updates between calls count as forward.)
* communication: ``nccl:*`` / ``gloo:*`` host ranges and the device kernels they launch
  (``nccl*``/``rccl*`` kernels, or same external id), ``breakdown.role_masks``' rule.
* sync: the blocking runtime calls of ``syncs.SYNC_CALL`` (``cudaStreamSynchronize``,
  ``cudaMemcpy``, ...).

Priorities, in two levels:

1. Each host thread on its own: sync > data wait > communication > ``zero_grad`` >
   backward > forward inside a closure > closure gaps (other) > ``Optimizer.step`` >
   forward > annotations named backward > optimizer > forward. The innermost blocking range wins on its thread: a collective or a sync
   called inside a backward function is the thread waiting, not computing.
2. The rank, device first. An instant where device work (kernels, copies, sets; not
   communication kernels) runs goes to the phase of the host code that launched it
   (the launch with the same correlation id, placed by the rules above on its own
   thread: inside ``Optimizer.step#`` outside a closure or inside ``zero_grad``:
   optimizer; inside backward: backward; anything else, unmatched work included:
   forward); overlapping device work of several phases (several streams) goes to
   optimizer > backward > forward. Then communication kernels with no other device
   work: exposed communication. With the device idle, the host's state: sync > data
   wait > optimizer > backward > forward > communication > other. Host communication
   comes after the compute phases here: a collective on one thread while another
   computes is overlapped, not exposed (CPU DDP: gloo runs on its own threads); the
   thread that waits for it shows it at level 1.

CPU-only traces take level 1 and the host part of level 2. Steps are
``breakdown.adjusted_steps`` (moved to the device side), the breakdown's windows.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from stepscope.analyzers.trace.breakdown import (
    DEVICE_WORK_CATS,
    LAUNCH_CATS,
    adjusted_steps,
    cat_mask,
    name_mask,
    rank_rows,
    role_masks,
)
from stepscope.analyzers.trace.intervals import intersect, merge
from stepscope.analyzers.trace.load import Trace
from stepscope.analyzers.trace.priority import per_window_sums, priority_segments
from stepscope.analyzers.trace.syncs import SYNC_CALL

PHASES = ("data_wait", "forward", "backward", "optimizer", "communication", "sync", "other")
# Level 2 (rank) order of the host phases when the device is idle.
HOST_ORDER = ("sync", "data_wait", "optimizer", "backward", "forward", "communication")
DEVICE_ORDER = ("optimizer", "backward", "forward")

# Backward ranges: the engine's wrapper (torch >= 1.10) and bare autograd function names
# (``AddmmBackward0``, ``NllLossBackward`` in 2021 traces; ``torch::autograd::AccumulateGrad``).
_BACKWARD_OP = re.compile(
    r"^(autograd::engine::evaluate_function: |torch::autograd::)|^[A-Za-z0-9_]+Backward\d*$"
)
# The Python tracer's frames of the backward call (``loss.backward()``, ``autograd.grad``).
_BACKWARD_CALL = re.compile(r"^torch/(_tensor|autograd/__init__)\.py\(\d+\): (backward|grad)$")
# User annotations that name their phase (HTA's test traces: ``## backward ##``; DDP's
# ``DistributedDataParallel.forward``; Lightning's profiler: ``...optimizer_step``).
_NAMED_REGION = {
    "backward": re.compile(r"(?i)(^|[^a-z])backward([^a-z]|$)"),
    "optimizer": re.compile(r"(?i)(^|[^a-z])(optimizer|optim|zero_grad)([^a-z]|$)"),
    "forward": re.compile(r"(?i)(^|[^a-z])forward([^a-z]|$)"),
}
_STEP = "ProfilerStep#"
_OPT_STEP = "Optimizer.step#"
_ZERO_GRAD = "Optimizer.zero_grad#"
_MODULE_CALL = "nn.Module: "

Spans = tuple[np.ndarray, np.ndarray]


def step_phases(trace: Trace, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (rank, step): rank, step, start, end, duration, and each phase (ns).

    The phases of a row add up to its duration (each instant counted once). ``steps`` is
    ``breakdown.adjusted_steps(trace)`` when the caller already has it (the report does).
    """
    steps = adjusted_steps(trace) if steps is None else steps
    rows = rank_rows(trace.events, trace.ranks)
    step_rank = steps["rank"].to_numpy()
    frames = [
        _rank_phases(trace.events.iloc[rows[rank]], steps[step_rank == rank])
        for rank in trace.ranks
    ]
    return pd.concat(frames, ignore_index=True)


def average_phases(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank and phase: mean time per step (ns) and share of the mean step (%).

    Share = mean phase / mean step, as ``breakdown.average_breakdown`` (tb-profiler).
    """
    rows = []
    for rank, g in per_step.groupby("rank", sort=True):
        mean = g[["duration", *PHASES]].mean()
        for p in PHASES:
            share = 100.0 * mean[p] / mean["duration"] if mean["duration"] > 0 else 0.0
            rows.append(
                {"rank": int(rank), "phase": p, "mean_ns": float(mean[p]), "percent": share}
            )
    return pd.DataFrame(rows, columns=["rank", "phase", "mean_ns", "percent"])


def phase_shares(per_step: pd.DataFrame) -> dict[str, float]:
    """Phase -> share of all step time (0..1) over all steps of all ranks."""
    total = float(per_step["duration"].sum())
    if total <= 0:
        return {p: 0.0 for p in PHASES}
    return {p: float(per_step[p].sum()) / total for p in PHASES}


# -- one rank ------------------------------------------------------------------------


def _rank_phases(ev: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    lo = steps["start"].to_numpy().astype(np.int64)
    hi = steps["end"].to_numpy().astype(np.int64)
    thread = _thread_codes(ev)
    m = _masks(ev, thread)
    ts = ev["ts"].to_numpy().astype(np.int64)
    end = ev["end"].to_numpy().astype(np.int64)
    closure = _closure_spans(
        (ts[m["opt_step"]], end[m["opt_step"]]),
        (ts[m["backward"] | m["backward_call"]], end[m["backward"] | m["backward_call"]]),
    )
    host = _host_phases(m, ts, end, thread, closure)
    device = _device_phases(ev, m, ts, end, thread, closure)

    roles = [device[p] for p in DEVICE_ORDER]
    names = list(DEVICE_ORDER)
    roles.append((ts[m["comm_kernel"]], end[m["comm_kernel"]]))
    names.append("communication")
    roles.extend(host[p] for p in HOST_ORDER)
    names.extend(HOST_ORDER)
    bounds, label = priority_segments(roles, np.concatenate([lo, hi]))
    sums = per_window_sums(bounds, label, len(roles) + 1, lo, hi)

    cols: dict[str, np.ndarray] = {c: steps[c].to_numpy() for c in ("rank", "step")}
    cols["start"], cols["end"], cols["duration"] = lo, hi, hi - lo
    for p in PHASES:
        cols[p] = np.zeros(len(lo), dtype=np.int64)
    for k, p in enumerate(names):
        cols[p] = cols[p] + sums[:, k]
    cols["other"] = cols["other"] + sums[:, len(roles)]
    return pd.DataFrame(cols)


def _masks(ev: pd.DataFrame, thread: np.ndarray) -> dict[str, np.ndarray]:
    """The rows each rule reads, evaluated once per distinct name (``name_mask``)."""
    names = ev["name"]
    roles = role_masks(ev)
    on_device = ev["on_device"].to_numpy()
    host = cat_mask(ev, ("cpu_op", "user_annotation"))
    op = cat_mask(ev, ("cpu_op",))
    launch = cat_mask(ev, LAUNCH_CATS)
    python = cat_mask(ev, ("python_function",))
    step = name_mask(names, lambda n: n.startswith(_STEP)) & host
    backward = name_mask(names, lambda n: bool(_BACKWARD_OP.match(n))) & op
    comm = roles["Communication"]
    return {
        "step": step,
        "sync": name_mask(names, lambda n: bool(SYNC_CALL.match(n))) & launch,
        "data_wait": roles["DataLoader"],
        "comm_host": comm & ~on_device,
        "comm_kernel": comm & on_device,
        "zero_grad": name_mask(names, lambda n: n.startswith(_ZERO_GRAD)) & host,
        "opt_step": name_mask(names, lambda n: n.startswith(_OPT_STEP)) & host,
        "backward": backward | _engine_thread_ops(thread, op | launch, backward, step),
        "backward_call": name_mask(names, lambda n: bool(_BACKWARD_CALL.match(n))) & python,
        "module_call": name_mask(names, lambda n: n.startswith(_MODULE_CALL)) & python,
        "work": (op | launch) & ~step,
        **{
            f"named_{p}": name_mask(names, lambda n, r=r: bool(r.search(n)))
            & cat_mask(ev, ("user_annotation",))
            & ~step
            for p, r in _NAMED_REGION.items()
        },
        "launch": launch & (ev["correlation"].to_numpy() >= 0),
        "device_work": cat_mask(ev, DEVICE_WORK_CATS) & ~comm,
    }


def _thread_codes(ev: pd.DataFrame) -> np.ndarray:
    """Dense id per (pid, tid); -1 for device rows (their pid/tid name a device/stream)."""
    pid = ev["pid"].to_numpy().astype(np.int64)
    tid = ev["tid"].to_numpy().astype(np.int64)
    codes = pd.factorize(pd.factorize(pid)[0].astype(np.int64) * (1 << 32) + tid)[0]
    return np.where(ev["on_device"].to_numpy(), -1, codes).astype(np.int64)


def _engine_thread_ops(
    thread: np.ndarray, ops: np.ndarray, backward: np.ndarray, step: np.ndarray
) -> np.ndarray:
    """Operators of the autograd engine's device threads: threads with backward ranges
    and no ProfilerStep#. Without any ProfilerStep# the main thread is unknown: none."""
    if not step.any() or not backward.any():
        return np.zeros(thread.size, dtype=bool)
    engine = np.setdiff1d(np.unique(thread[backward]), np.unique(thread[step]))
    return ops & np.isin(thread, engine)


def _closure_spans(opt: Spans, backward: Spans) -> Spans:
    """[Optimizer.step start, end of the last backward range starting inside it) for each
    optimizer step that runs backward work (a closure); see the module docstring."""
    o_s, o_e = opt
    if o_s.size == 0 or backward[0].size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(backward[0], kind="stable")
    b_s, b_e = backward[0][order], backward[1][order]
    first = np.searchsorted(b_s, o_s, side="left")
    last = np.searchsorted(b_s, o_e, side="left")
    starts, ends = [], []
    for s, e, i, j in zip(o_s, o_e, first, last, strict=True):
        if j > i:  # a handful of optimizer steps per trace: a loop is fine
            starts.append(s)
            ends.append(min(int(e), int(b_e[i:j].max())))
    return np.asarray(starts, np.int64), np.asarray(ends, np.int64)


def _host_phases(
    m: dict[str, np.ndarray],
    ts: np.ndarray,
    end: np.ndarray,
    thread: np.ndarray,
    closure: Spans,
) -> dict[str, Spans]:
    """Level 1: each thread's pieces by its own priorities, gathered per phase."""
    out: dict[str, list[Spans]] = {p: [] for p in HOST_ORDER}
    for t in np.unique(thread[thread >= 0]):
        mine = thread == t

        def spans(key: str, mine: np.ndarray = mine) -> Spans:
            sel = m[key] & mine
            return ts[sel], end[sel]

        work = merge(*spans("work"))
        fwd_closure = intersect(work, merge(*closure))
        module = spans("module_call")
        roles = [
            (spans("sync"), "sync"),
            (spans("data_wait"), "data_wait"),
            (spans("comm_host"), "communication"),
            (spans("zero_grad"), "optimizer"),
            (spans("backward"), "backward"),
            (spans("backward_call"), "backward"),
            (_cat(fwd_closure, module), "forward"),
            (closure, "other"),
            (spans("opt_step"), "optimizer"),
            (work, "forward"),
            *((spans(f"named_{p}"), p) for p in _NAMED_REGION),
        ]
        bounds, label = priority_segments([r for r, _ in roles], np.empty(0, np.int64))
        if bounds.size < 2:
            continue
        for k, (_, phase) in enumerate(roles):
            if phase == "other":
                continue
            hit = np.flatnonzero(label == k)
            out[phase].append((bounds[hit], bounds[hit + 1]))
    return {p: _cat(*parts) if parts else _empty() for p, parts in out.items()}


def _device_phases(
    ev: pd.DataFrame,
    m: dict[str, np.ndarray],
    ts: np.ndarray,
    end: np.ndarray,
    thread: np.ndarray,
    closure: Spans,
) -> dict[str, Spans]:
    """Device work (not communication) per phase of the host code that launched it."""
    work = np.flatnonzero(m["device_work"])
    if work.size == 0:
        return {p: _empty() for p in DEVICE_ORDER}
    corr = ev["correlation"].to_numpy()
    l_rows = np.flatnonzero(m["launch"])
    l_phase = np.full(l_rows.size, DEVICE_ORDER.index("forward"), dtype=np.int8)
    for t in np.unique(thread[l_rows]):
        mine = thread == t

        def spans(key: str, mine: np.ndarray = mine) -> Spans:
            sel = m[key] & mine
            return ts[sel], end[sel]

        roles = [
            (spans("zero_grad"), "optimizer"),
            (spans("backward"), "backward"),
            (spans("backward_call"), "backward"),
            (closure, "forward"),
            (spans("opt_step"), "optimizer"),
        ]
        bounds, label = priority_segments([r for r, _ in roles], np.empty(0, np.int64))
        if bounds.size < 2:
            continue
        code = np.array([DEVICE_ORDER.index(p) for _, p in roles] + [2], dtype=np.int8)
        on_t = np.flatnonzero(thread[l_rows] == t)
        piece = np.searchsorted(bounds, ts[l_rows[on_t]], side="right") - 1
        inside = (piece >= 0) & (piece < label.size)
        l_phase[on_t[inside]] = code[label[piece[inside]]]
    w_phase = _lookup(corr[l_rows], l_phase, corr[work], DEVICE_ORDER.index("forward"))
    return {
        p: (ts[work[w_phase == k]], end[work[w_phase == k]]) for k, p in enumerate(DEVICE_ORDER)
    }


def _lookup(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, default: int) -> np.ndarray:
    """values[keys == w] for each w (the last of equal keys), ``default`` when none."""
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    last = np.ones(k.size, dtype=bool)
    last[:-1] = k[1:] != k[:-1]
    k, v = k[last], v[last]
    out = np.full(wanted.size, default, dtype=np.int8)
    if k.size == 0:
        return out
    pos = np.minimum(np.searchsorted(k, wanted), k.size - 1)
    hit = k[pos] == wanted
    out[hit] = v[pos[hit]]
    return out


def _cat(*parts: Spans) -> Spans:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _empty() -> Spans:
    return np.empty(0, np.int64), np.empty(0, np.int64)
