"""More work per step: the evidence of a regression that the machine's speed cannot fake.

``stepscope check`` judges step time with intervals over each run's steps, and those say
nothing of run-to-run spread: on a shared 2-core VM two runs of one job differ by 3-10 %
(bench/README.md, "Diff and check"), so a time alone cannot tell a 10 % regression from
a slow afternoon. The work a step does is another matter. An operator or kernel that the
run calls more often per step than the baseline did (a matrix multiply added to the
loop, a synchronisation on every step) is more work on any machine, and its cost is
measured inside the run alone: the extra calls times the run's own mean call, with a
bootstrap interval over the run's calls. Against a step as the step timer measured it
(no profiler: the slowdown a check allows is of that step), a cost beyond the allowed
slowdown even at the interval's optimistic end makes the run slower by itself.
Operators that only got slower per call stay with the step-time figures: their change
is the one a busy machine imitates.

Which step: the baseline's step, or the run's own less the added work (``run_step_ns``,
what ``check`` passes), whichever is shorter. Both estimate the step without the added
work on one machine, and both are only ever inflated by something else: the baseline's
by a slow minute of its run (a baseline recorded at a load of 22 on the shared VM was 3x
slower and shrank a 17 % matmul to under 5 %), the run's by other work it added (a
``randn`` whose time its mean call misses) or by a slow minute, which inflates the added
work's own cost as well. So the shorter is the better estimate; without ``run_step_ns``
(a diff of traces alone), the baseline's step.

Why not the operator diff's own interval: for a name it is of the whole time per step,
run minus baseline, and carries the noise of every call of both runs; on a 3-step
capture of a 3 ms step, the seven matmuls that were there before varied by more than the
one added (bench/README.md). The diff splits a name whose calls changed by input shapes
(``report/call_shapes.py``), and here the extra calls are measured alone, in the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from stepscope.analyzers.report.call_shapes import MIN_CALL_CHANGE
from stepscope.analyzers.report.op_diff import CONFIDENCE, RESAMPLES

WORK_KINDS = ("operator", "kernel")
BASE = "the baseline's step"


@dataclass(frozen=True)
class AddedWork:
    """One operator or kernel the run calls more often per step than the baseline."""

    kind: str
    name: str
    extra_calls: float  # more calls per step in the run
    added_ns: float  # the extra calls times the run's mean call
    least_ns: float  # the same with the low end of the mean call's interval
    step_ns: float  # the step the allowed slowdown is of (module docstring)
    scale: str = BASE  # what ``step_ns`` is, in words

    @property
    def share(self) -> float:
        """The least extra time, as a share of ``step_ns``."""
        return self.least_ns / self.step_ns

    def describe(self) -> str:
        calls = f"{self.extra_calls:.1f}".rstrip("0").rstrip(".")
        return (
            f"{self.name} is called {calls} more time{'' if calls == '1' else 's'} per step, "
            f"at least +{self.least_ns / 1e6:.3g} ms ({self.share * 100:.1f} % of "
            f"{self.scale})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "extra_calls_per_step": self.extra_calls,
            "added_ns": self.added_ns,
            "least_ns": self.least_ns,
            "share_of_step": self.share,
            "step_ns": self.step_ns,
            "of": self.scale,
        }


def added_work(diff: Any, run_step_ns: float | None = None) -> list[AddedWork]:
    """What a ``RunDiff`` says the run calls more often per step (operators and kernels;
    an operator by its input shapes where the trace has them: ``report/call_shapes.py``),
    with the least it costs, largest first. Empty without traces on both sides or a
    baseline step. Whatever the diff's status says: its interval is the one this module
    does not trust. ``run_step_ns``: the run's timed step, the other scale (less each
    added work) of the module docstring."""
    ca, cb = diff.calls_a, diff.calls_b
    step = diff.timed_step_ns_a if np.isfinite(diff.timed_step_ns_a) else diff.step_ns_a
    if ca is None or cb is None or not diff.windows_b or not np.isfinite(step) or step <= 0:
        return []
    ca, cb = ca[ca["kind"].isin(WORK_KINDS)], cb[cb["kind"].isin(WORK_KINDS)]
    per_a = ca.groupby(["kind", "name"]).size() / max(diff.windows_a, 1)
    per_b = cb.groupby(["kind", "name"]).size() / max(diff.windows_b, 1)
    extra = per_b.sub(per_a, fill_value=0.0)
    extra = extra[extra >= MIN_CALL_CHANGE]
    if extra.empty:
        return []
    times = dict(iter(cb.groupby(["kind", "name"])["time_ns"]))
    found = []
    for (kind, name), calls in extra.items():
        mean, low = _mean_call(times[(kind, name)].to_numpy(dtype=float))
        own = (run_step_ns or 0.0) - calls * mean  # the run's step without this work
        scale = (own, "the run's own step without it") if 0 < own < step else (step, BASE)
        found.append(
            AddedWork(str(kind), str(name), float(calls), calls * mean, calls * low, *scale)
        )
    return sorted(found, key=lambda w: -w.least_ns)


def _mean_call(times: np.ndarray) -> tuple[float, float]:
    """A call's mean time and the low end of its 95 % bootstrap interval."""
    mean = float(times.mean())
    if times.size < 2 or np.ptp(times) == 0:
        return mean, mean
    res = stats.bootstrap(
        (times,),
        np.mean,
        vectorized=True,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    return mean, float(res.confidence_interval.low)


def beyond(work: list[AddedWork], max_slowdown: float) -> list[AddedWork]:
    """The added work that by itself costs more than the allowed slowdown."""
    return [w for w in work if w.share > max_slowdown]


__all__ = ["AddedWork", "added_work", "beyond"]
