"""A run's earlier experiments on the Optimize page: the table that reopens them, and
what they tell the set-up form (which fixes were measured, how long a trial takes).

Decisions, and why:

* **A fix measured slower, or with no measurable change, on this run is not pre-ticked**,
  and the form says so beside it ("measured 0.97x in experiment 1"). Ticking it again by
  default spends trial runs re-measuring what is known; it stays one click away, since
  a machine or a job can change. The newest measurement of a fix counts.
* **The time estimate uses measured trial times** when an earlier experiment on this run,
  or else on a run of the same command line, has finished trials: mean trial seconds ×
  trial runs. The heuristic (start-up + steps × the baseline's median step) leaves out
  what every trial pays again (interpreter, imports, the DataLoader's workers), and read
  "3.6 min or less" beside an experiment of fewer trials that took 3.9 min.
* Batch-size sweeps are left out of both: their trials run other batch sizes, and they
  measure no fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from stepscope.app.dashboard import data, ui
from stepscope.optim_runner.speedup.stats import NO_CHANGE, SLOWER
from stepscope.optim_runner.sweeps.sweep import SWEEP_KIND
from stepscope.optim_runner.trials import plan as planning
from stepscope.optim_runner.trials.failures import slow_starting
from stepscope.optim_runner.trials.trials import candidate_arms

#: a trial run that ended this way ran its steps; a crashed or cancelled one did not
FINISHED_TRIAL = frozenset({"stopped", "completed"})


@dataclass(frozen=True)
class Measured:
    """A fix's newest measurement on the run: in which experiment, the ratio, the verdict."""

    experiment_id: int
    speedup: float | None
    verdict: str

    @property
    def not_worth_ticking(self) -> bool:
        """Measured slower, or no measurable change: not ticked again by default."""
        return self.verdict in (SLOWER, NO_CHANGE)

    def note(self) -> str:
        ratio = f"{self.speedup:.2f}x " if self.speedup is not None else ""
        text = f"measured {ratio}in experiment {self.experiment_id} ({self.verdict})"
        return text + (": not ticked" if self.not_worth_ticking else "")


@dataclass(frozen=True)
class TrialTimes:
    """How long an earlier experiment's finished trial runs took."""

    experiment_id: int
    baseline_run_id: int
    mean_s: float
    n: int
    steps: int | None  # steps per trial it ran with


def _fix_experiments(experiments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Completed experiments over fixes (not sweeps), in the order given (newest first)."""
    return [
        e
        for e in experiments
        if e["status"] == "completed" and (e.get("config") or {}).get("kind") != SWEEP_KIND
    ]


def earlier_measurements(experiments: list[dict[str, Any]]) -> dict[str, Measured]:
    """Per fix id, its newest measurement in ``experiments`` (one run's, newest first);
    a fix that was not measured there (failed, not applied) has none."""
    out: dict[str, Measured] = {}
    for e in _fix_experiments(experiments):
        for fix in (e.get("result") or {}).get("fixes") or []:
            if fix.get("verdict") and fix.get("id") not in out:
                out[fix["id"]] = Measured(int(e["id"]), fix.get("measured"), fix["verdict"])
    return out


def trial_times(home: str, run: dict[str, Any]) -> TrialTimes | None:
    """The newest completed experiment on ``run`` (else on a run of its exact command)
    with finished trial runs, and their mean wall time; None when there is none."""
    relations = data.run_relations(home)
    experiments = _fix_experiments(data.all_experiments(home))
    mine = [e for e in experiments if e["baseline_run_id"] == run["id"]]
    if not mine and run.get("command"):
        same = {i for i, r in relations.items() if r["command"] == list(run["command"])}
        mine = [e for e in experiments if e["baseline_run_id"] in same]
    for e in mine:
        seconds = [
            float(r["ended_at"]) - float(r["started_at"])
            for r in relations.values()
            if r["experiment"] == e["id"]
            and r["status"] in FINISHED_TRIAL
            and r["ended_at"] is not None
            and r["started_at"] is not None
        ]
        if seconds:
            steps = (e.get("config") or {}).get("steps")
            return TrialTimes(
                experiment_id=int(e["id"]),
                baseline_run_id=int(e["baseline_run_id"]),
                mean_s=sum(seconds) / len(seconds),
                n=len(seconds),
                steps=int(steps) if steps is not None else None,
            )
    return None


def estimate(
    run: dict[str, Any],
    steps_df: pd.DataFrame,
    plans: list[dict],
    trials: int,
    steps: int,
    measured: TrialTimes | None = None,
) -> str:
    """How many trial runs, and roughly how long: at ``measured`` trial times when an
    earlier experiment has them, else at the baseline's pace."""
    fixes = [planning.PlannedFix(**p) for p in plans]
    arms = 1 + len(candidate_arms(fixes))
    runs = arms * trials
    text = (
        f"{arms} arms (the baseline, all checked fixes together"
        + (", each fix alone" if len(fixes) > 1 else "")
        + f") × {trials} trials = {runs} trial runs at most (an arm whose verdict "
        "is clear stops early)"
    )
    if measured is not None:
        where = (
            "on this run"
            if measured.baseline_run_id == run["id"]
            else f"on run {measured.baseline_run_id}, the same command"
        )
        other_steps = measured.steps is not None and measured.steps != steps
        text += (
            f", about {measured.mean_s:.0f} s each as measured in experiment "
            f"{measured.experiment_id} {where} ({measured.n} trial runs"
            + (f" of {measured.steps} steps" if other_steps else "")
            + f"): {runs * measured.mean_s / 60:.1f} min or less"
        )
    elif not steps_df.empty and run.get("started_at"):
        startup = max(0.0, float(steps_df["start_s"].min()) - float(run["started_at"]))
        per_step = float((steps_df["end_s"] - steps_df["start_s"]).median())
        trial_s = startup + steps * per_step
        text += (
            f", about {trial_s:.0f} s each at the baseline's pace: "
            f"{runs * trial_s / 60:.1f} min or less"
        )
    slow = slow_starting([p["id"] for p in plans])
    if slow:
        text += f"; {', '.join(slow)} compiles first, which can add minutes per trial"
    if len(fixes) > 1:
        text += (
            f"; when the fastest arm holds several fixes, leave-one-out adds up to "
            f"{len(fixes) + 1} trial runs per step (the set, and the set without each fix), "
            "counted in the progress as they are planned"
        )
    return text + "."


# -- past experiments ----------------------------------------------------------------------
def _outcome(e: dict[str, Any]) -> str:
    if e["status"] == "running":
        p = e.get("progress") or {}
        return f"{p.get('done', 0)} of {p.get('total') or '?'} trial runs"
    if e["status"] == "failed":
        lines = str(e.get("error") or "").strip().splitlines()
        return "cancelled" if lines == ["interrupted"] else (lines[0] if lines else "failed")
    result = e.get("result") or {}
    largest = result.get("largest_batch") or {}  # a training job's sweep
    if largest.get("batch_size") and largest.get("limit_bytes"):
        return f"batch sweep: largest batch that fits {largest['batch_size']}"
    if knee := result.get("knee"):  # a batch-size sweep (optim_runner/sweeps/sweep.py)
        return f"batch sweep: knee at batch {knee.get('batch_size')}"
    best = result.get("best") or {}
    if best.get("fixes"):
        return f"keep {', '.join(best['fixes'])}: {best['speedup']:.2f}x"
    return "no fix kept"


def experiments_table(run_id: int, experiments: list[dict[str, Any]], current: int | None) -> None:
    """The run's experiments, newest first, each with a link that reopens it."""
    st.subheader("Experiments on this run")
    if not experiments:
        st.caption("No experiment on this run yet.")
        return
    rows = [
        {
            "id": e["id"],
            "open": f"optimize?run={run_id}&experiment={e['id']}",
            "status": ("▶ " if e["id"] == current else "")
            + ui.STATUS_MARK.get(e["status"], e["status"]),
            "started": datetime.fromtimestamp(e["created_at"]),
            "fixes": ", ".join((e.get("config") or {}).get("fixes") or []),
            "trials × steps": f"{(e.get('config') or {}).get('trials', '?')} × "
            f"{(e.get('config') or {}).get('steps', '?')}",
            "outcome": _outcome(e),
        }
        for e in experiments
    ]
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        key="experiments",
        column_config={
            "id": st.column_config.NumberColumn("id", format="%d", width="small"),
            "open": st.column_config.LinkColumn("open", display_text="open ›", width="small"),
            "started": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
        },
    )
