"""What changed between two runs, operator by operator, with how sure we are of it.

HTA's TraceDiff lists per-operator differences without statistics, so one noisy run
reads as a regression. Here every difference of time per step comes with a 95 %
bootstrap interval (``scipy.stats.bootstrap``, percentile method, seeded), over steps
where both runs have at least ``MIN_STEPS`` of them (the step timer's phases, a long
capture), else over calls (time per step = mean call x calls per step; a default
capture has 3 steps, too few to resample, but thousands of calls).

Status of a name: "new" / "gone" when one run never called it; "slower" / "faster"
when the whole interval lies beyond the smallest change worth a line
(``max(MIN_STEP_SHARE of the baseline's step, MIN_OWN_SHARE of the name's own
time)``: a few microseconds of a 5 ms operator are real but nobody's problem); else
"no measurable change". Rows are sorted by the size of the change, measured changes
before the rest, so the top lines answer "where did the time go".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

COLUMNS = ["kind", "name", "a_ns", "b_ns", "diff_ns", "lo_ns", "hi_ns"]
COLUMNS += ["a_calls", "b_calls", "status", "basis"]
SLOWER, FASTER, SAME, NEW, GONE = "slower", "faster", "no measurable change", "new", "gone"
STATUSES = (SLOWER, FASTER, SAME, NEW, GONE)
#: Resample steps when both sides have this many; fewer, resample calls.
MIN_STEPS = 5
#: The smallest change reported as one: 1 % of the baseline's step ...
MIN_STEP_SHARE = 0.01
#: ... or 5 % of the name's own time per step, whichever is larger.
MIN_OWN_SHARE = 0.05
CONFIDENCE = 0.95
RESAMPLES = 999
SEED = 0


def _interval(a: np.ndarray, b: np.ndarray, scale_a: float, scale_b: float) -> tuple[float, float]:
    """Interval of ``scale_b * mean(b) - scale_a * mean(a)`` (independent samples)."""
    if a.size < 2 or b.size < 2:
        d = scale_b * float(b.mean()) - scale_a * float(a.mean())
        return d, d
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        d = scale_b * float(b[0]) - scale_a * float(a[0])
        return d, d

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return scale_b * y.mean(axis=axis) - scale_a * x.mean(axis=axis)

    res = stats.bootstrap(
        (a, b),
        statistic,
        paired=False,
        vectorized=True,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(SEED),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _per_step(calls: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """(kind, name) x window -> ns, with 0 where a name was not called in a window."""
    keys = ["rank", "step"]
    total = calls.groupby(["kind", "name", *keys], sort=False)["time_ns"].sum()
    wide = total.unstack(keys, fill_value=0)
    index = pd.MultiIndex.from_frame(windows[keys])
    return wide.reindex(columns=index, fill_value=0)


def diff_calls(
    calls_a: pd.DataFrame,
    windows_a: pd.DataFrame,
    calls_b: pd.DataFrame,
    windows_b: pd.DataFrame,
    step_ns_a: float,
) -> pd.DataFrame:
    """One row per (kind, name) of either run (``COLUMNS``), measured changes first.

    ``calls_*``: one row per call (``rank, step, kind, name, time_ns``; see
    ``trace.op_steps.op_calls``, or one row per step for step-timer phases);
    ``windows_*``: the (rank, step) windows they are over; ``step_ns_a``: the
    baseline's mean step, the scale of "a change worth a line".
    """
    n_a, n_b = max(len(windows_a), 1), max(len(windows_b), 1)
    by_steps = len(windows_a) >= MIN_STEPS and len(windows_b) >= MIN_STEPS
    steps_a = _per_step(calls_a, windows_a) if by_steps else None
    steps_b = _per_step(calls_b, windows_b) if by_steps else None
    groups_a = dict(iter(calls_a.groupby(["kind", "name"], sort=False)["time_ns"]))
    groups_b = dict(iter(calls_b.groupby(["kind", "name"], sort=False)["time_ns"]))
    rows = []
    for key in dict.fromkeys([*groups_a, *groups_b]):
        a = groups_a.get(key, pd.Series(dtype="int64")).to_numpy(dtype=float)
        b = groups_b.get(key, pd.Series(dtype="int64")).to_numpy(dtype=float)
        a_ns, b_ns = a.sum() / n_a, b.sum() / n_b
        diff = b_ns - a_ns
        lo = hi = np.nan
        basis = "steps" if by_steps else "calls"
        if not a.size:
            status = NEW
        elif not b.size:
            status = GONE
        else:
            floor = max(MIN_STEP_SHARE * step_ns_a, MIN_OWN_SHARE * a_ns)
            if abs(diff) < floor:  # the interval cannot lie beyond it: skip the resampling
                status = SAME
            else:
                if by_steps:
                    sa, sb = steps_a.loc[key].to_numpy(float), steps_b.loc[key].to_numpy(float)
                    lo, hi = _interval(sa, sb, 1.0, 1.0)
                else:
                    lo, hi = _interval(a, b, a.size / n_a, b.size / n_b)
                status = SLOWER if lo > floor else FASTER if hi < -floor else SAME
        rows.append((*key, a_ns, b_ns, diff, lo, hi, a.size / n_a, b.size / n_b, status, basis))
    out = pd.DataFrame(rows, columns=COLUMNS)
    # measured changes first, each group by size: an estimate whose interval says "no
    # measurable change" is noise, however large, and must not top "where the time went"
    order = np.lexsort((-out["diff_ns"].abs().to_numpy(), (out["status"] == SAME).to_numpy()))
    return out.iloc[order].reset_index(drop=True)


def phase_calls(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The step timer's phases as calls (one per timed step) and their windows: a run
    without a trace is diffed over these, data wait, forward, backward, optimizer, other."""
    phases = {"data wait": "data_wait_s", "forward": "forward_s", "backward": "backward_s"}
    phases["optimizer step"] = "optimizer_s"
    df = steps.reset_index(drop=True)
    step_s = (df["end_s"] - df["start_s"]).clip(lower=0.0)
    windows = pd.DataFrame({"rank": df["rank"].to_numpy(), "step": np.arange(len(df))})
    frames, known = [], pd.Series(0.0, index=df.index)
    for label, col in phases.items():
        if col not in df or df[col].isna().all():
            continue
        s = df[col].fillna(0.0).clip(lower=0.0)
        known += s
        frames.append(windows.assign(kind="phase", name=label, time_ns=(s * 1e9).round()))
    other = (step_s - known).clip(lower=0.0)
    frames.append(windows.assign(kind="phase", name="other", time_ns=(other * 1e9).round()))
    calls = pd.concat(frames, ignore_index=True)
    calls = calls[calls["time_ns"] > 0]  # a phase with no time is not a call
    return calls.astype({"time_ns": "int64"}), windows
