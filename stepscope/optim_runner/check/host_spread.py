"""How much two runs of one unchanged job differ on a host, and a one-run interval
widened by it.

An interval over one run's steps says how well that run measured itself (about ±1 % on
the bench job), not how much a second run would differ: on the shared 2-core VM two
runs of one job measured medians 16.7 % apart, and a check of one against the other
read "at least 14.2 % slower" (issue 36). So a side judged on one run needs the host's
run-to-run spread from elsewhere, in this order:

1. **History**: earlier finished runs of the sides' own names on the side's host (two
   or more of a name), up to the newer of the two runs checked, so that a check of old
   runs gives the answer it gave then. Their figure's log values, pooled over the
   names: ``s^2 = sum over names of sum (x - mean_name)^2 / sum (n_name - 1)``. Other
   jobs' runs are not used: a 3 ms step and a 1 s step do not spread alike.
2. **Calibration**: ``stepscope calibrate --noise`` of that host (``run_noise.py``),
   whole runs of one small fixed job; the statistic that matches the figure (the mean
   step for throughput and tokens/s, the median for a median or p50, the p99 for p99).

**The widened interval.** On the log scale the per-step bootstrap gives the estimate
``L = log(ratio)`` and its interval ``[log lo, log hi]``, i.e. within-run standard
errors ``(L - log lo) / z`` below and ``(log hi - L) / z`` above (z = 1.96 at 95 %; the
bootstrap interval may be lopsided, so each end keeps its own). Each side's figure is
also one draw from its host's run-to-run distribution, with standard deviation ``s_a``
and ``s_b`` on the log scale, independent of the within-run error, so the variances
add: ``se^2 = se_within^2 + s_a^2 + s_b^2``. The interval is ``L -/+ t * se``, with
Student's t at Welch-Satterthwaite's degrees of freedom: the between-run variance is
estimated from few runs (``df``: history ``sum (n_name - 1)``, calibration its runs - 1),
the within-run one from hundreds of steps (taken as known), so
``nu = df * (se^2 / (s_a^2 + s_b^2))^2``: t at ``df`` where the spread dominates (the
usual case: 3-10 % against ±1 %), near z where the run's own steps are the wider part
(a run with one long pause). The history's run values carry their own within-run noise
as well, which this counts twice: conservative, by about the ±1 % of a run's interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from stepscope.optim_runner.check.over_runs import FINISHED, judged_steps, run_value
from stepscope.optim_runner.speedup.stats import SpeedupCI, judged_ratio
from stepscope.store.calibration import cached_noise

#: Runs of a name read for its history, the newest: older ones say less of today's host.
HISTORY_RUNS = 10

#: The statistic of calibrate --noise that spreads as a check figure does.
STATISTIC = {
    "throughput": "mean",
    "tokens/s": "mean",
    "median step time": "median",
    "median request time": "median",
    "p50 latency": "median",
    "p99 latency": "p99",
}


@dataclass(frozen=True)
class Spread:
    """A host's run-to-run spread of one figure: the standard deviation of its log
    between runs (about its coefficient of variation) and where it comes from."""

    sd: float
    df: int  # degrees of freedom of ``sd``
    source: str  # "history" or "calibration"
    detail: str  # which runs, or the calibration's conditions
    host: str

    def describe(self) -> str:
        """'6.2 % per run, from 3 runs of 'a' and 3 of 'a2' on host-1'."""
        return f"{self.sd * 100:.1f} % per run, from {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "sd_log": self.sd,
            "df": self.df,
            "source": self.source,
            "detail": self.detail,
            "host": self.host,
        }


def history_spread(
    store: Any, figure: str, names: list[str], host: str, up_to: int
) -> Spread | None:
    """The pooled spread of ``figure`` over the finished runs of ``names`` on ``host``
    with ids up to ``up_to`` (the newest ``HISTORY_RUNS`` of each); None with no name
    that has two runs giving the figure."""
    runs = store.runs()
    mine = runs[(runs["host"] == host) & (runs["id"] <= up_to) & runs["status"].isin(FINISHED)]
    squares, df, said = 0.0, 0, []
    for name in dict.fromkeys(names):
        ids = mine[mine["name"] == name].sort_values("id", ascending=False)["id"]
        values = [run_value(figure, judged_steps(store, int(i))) for i in ids.head(HISTORY_RUNS)]
        logs = np.log([v for v in values if v is not None and v > 0])
        if logs.size >= 2:
            squares += float(((logs - logs.mean()) ** 2).sum())
            df += logs.size - 1
            said.append(f"{logs.size} runs of {name!r}")
    if df == 0:
        return None
    detail = f"{' and '.join(said)} on {host}"
    return Spread(float(np.sqrt(squares / df)), df, "history", detail, host)


def calibrated_spread(home: Any, figure: str, host: str) -> Spread | None:
    """The spread ``stepscope calibrate --noise`` measured on ``host``, or None."""
    noise = cached_noise(home, host)
    if noise is None or noise.runs < 2:
        return None
    sd = noise.cv.get(STATISTIC.get(figure, "median"))
    if sd is None or not np.isfinite(sd):
        return None
    return Spread(float(sd), noise.runs - 1, "calibration", noise.conditions(), host)


def host_spread(store: Any, figure: str, names: list[str], host: str, up_to: int) -> Spread | None:
    """History first (the job's own), else the host's calibration; None: unknown."""
    found = history_spread(store, figure, names, host, up_to)
    return found if found is not None else calibrated_spread(store.home, figure, host)


def widened(ci: SpeedupCI, base: Spread, run: Spread) -> SpeedupCI:
    """``ci`` (over one run's steps on each side) with each side's between-run variance
    added on the log scale, as the module docstring says."""
    estimate, z = np.log(ci.ratio), float(stats.norm.ppf(0.5 + ci.confidence / 2))
    below = (estimate - np.log(ci.lo)) / z
    above = (np.log(ci.hi) - estimate) / z
    between = base.sd**2 + run.sd**2
    df = min(base.df, run.df)

    def half(within: float) -> float:
        total = within**2 + between
        nu = df * (total / between) ** 2 if between > 0 else np.inf
        return float(stats.t.ppf(0.5 + ci.confidence / 2, nu) * np.sqrt(total))

    lo = float(np.exp(estimate - half(below)))
    hi = float(np.exp(estimate + half(above)))
    method = f"{ci.method}, widened by run-to-run spread"
    return judged_ratio(ci.ratio, lo, hi, ci.confidence, ci.n_baseline, ci.n_candidate, method)


__all__ = [
    "HISTORY_RUNS",
    "Spread",
    "calibrated_spread",
    "history_spread",
    "host_spread",
    "widened",
]
