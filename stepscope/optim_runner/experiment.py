"""Experiments: re-run a recorded job with fixes applied, and prove (or disprove) the gain.

``run_experiment`` takes a baseline run from the store and re-runs its recorded command
(same cwd, same arguments, bounded to ``steps``) as several *arms*: the baseline itself,
every chosen fix together, and each fix alone (the ablation: which fix earned what).
Each arm runs ``trials`` times; the result per candidate is the ratio of median step
times (and of samples/s) against the baseline with a bootstrap 95 % interval
(``stats.speedup_ci``), and a quality guard on the losses (``quality``).

Decisions, and why:

* **Interleaved, rotated trials.** Trial k runs every arm once, in the arm order rotated
  by k (A B C, B C A, C A B, ...): machine drift (a neighbour's burst, thermal state)
  then hits every arm, and no arm always runs first or after the same arm. A fixed
  order biased our paired overhead measurements (bench/overhead.py).
* **Warm-up excluded per trial**, as on the run page (``timed_step_times``), and
  reported separately: worker start-up or compilation is a cost, but a one-off one.
* **Applied, verified, or not measured.** After a candidate's trial the job's own
  report (``config.applied``) says whether each fix took effect on the real objects
  (``took_effect``); one that did not is "not applied" with the reason, is not run
  again, and gets no speed-up, verdict or "slower".
* **Fixes override what the script set** (``keep_explicit=False``, the default): the
  user asked to try them; the trial's log says what each replaced.
* **A failing candidate costs only itself.** A crash, an out-of-memory error or a hang
  (no end within the timeout: by default 5x the baseline trial, at least 60 s) is
  recorded with its error and the candidate is not run again; the others go on. A
  failing *baseline* ends the experiment: there is nothing left to compare with.
* **Fixes that need another fix** (persistent workers need workers) are measured alone
  together with that fix, and their own gain is read against that fix alone.
* **What to keep.** A fix is a candidate for keeping when it is measurably faster and
  keeps the loss. What is kept is the fastest measured candidate made only of such
  fixes: the combination of all of them (measured, or a confirmation arm run against
  the baseline once more), or a single fix when it alone measured faster than the
  combination (compile + channels_last 1.20x against channels_last alone 1.30x keeps
  channels_last).
* **Notes on the result.** A measured gain above its bound says which side the data
  say is off (``bound_check``); other work on the machine during the trials is
  measured from the system samples and reported with a warning (``contention``).
* **Everything in the store.** The trial runs are ordinary runs linked to the baseline
  (``parent_run_id``, their arm in ``config``, the plan in their folder); the
  experiment row holds progress while it runs and the full result at the end, so a
  dashboard can follow an experiment started in another process
  (``start_experiment`` / ``python -m stepscope.optim_runner.experiment``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.analyzers.step_stats import summarize_steps
from stepscope.fixes.took_effect import not_applied
from stepscope.optim_runner import plan as planning
from stepscope.optim_runner.bound_check import above_bound_note
from stepscope.optim_runner.contention import contention
from stepscope.optim_runner.plan import PlannedFix
from stepscope.optim_runner.quality import check_quality, loss_series
from stepscope.optim_runner.stats import SpeedupCI, sec_per_sample, speedup_ci, timed_step_times

DEFAULT_STEPS = 30
DEFAULT_TRIALS = 3
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 5.0
FALLBACK_TIMEOUT_S = 600.0  # the baseline's length is unknown (it never recorded a step)
SLOW_START_FIXES = ("torch_compile",)
SLOW_START_ALLOWANCE_S = 300.0
OUTPUT_LOG = "output.log"
# Recorded variables that are about where the job ran, not how: not replayed.
NOT_REPLAYED = ("VIRTUAL_ENV", "CONDA_DEFAULT_ENV")
FASTER = "faster"
NOT_APPLIED = "not_applied"

Progress = Callable[[dict[str, Any]], None]


class ExperimentError(RuntimeError):
    """The experiment cannot go on (nothing to try, the baseline fails)."""


class ExperimentInterrupted(KeyboardInterrupt):
    """A trial was interrupted by the user (Ctrl-C, SIGTERM): the experiment stops."""


@dataclass
class Arm:
    """One configuration of the job: the baseline, or a candidate set of fixes."""

    name: str
    kind: str  # 'baseline' | 'all' | 'alone' | 'confirm'
    fixes: list[PlannedFix]
    runs: list[int] = field(default_factory=list)
    error: str | None = None
    failure: str | None = None  # 'crash' | 'oom' | 'hang'
    failed_run: int | None = None
    not_applied: list[dict[str, str]] = field(default_factory=list)  # [{"fix", "why"}]

    @property
    def fix_ids(self) -> list[str]:
        return [f.id for f in self.fixes]

    @property
    def failed(self) -> bool:
        """Not run again: it failed, or its fixes did not take effect."""
        return self.error is not None or bool(self.not_applied)


# -- the experiment ----------------------------------------------------------------------
def run_experiment(
    store: Any,
    baseline_run_id: int,
    fixes: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    allow_numerics: bool = False,
    progress: Progress | None = None,
    *,
    tolerance: float = 0.05,
    seed: int | None = 0,
    experiment_id: int | None = None,
    keep_explicit: bool = False,
) -> dict[str, Any]:
    """Run an experiment on ``baseline_run_id`` in the foreground; returns its result.

    ``fixes``: fix ids to try (default: the run's recommended auto fixes); ``timeout_s``:
    per trial (default: from the baseline's length); ``progress`` is called with a dict
    (done/total trials, current arm and trial) before and after every trial, and the
    same dict is stored as the experiment's progress. ``experiment_id``: an experiment
    row created beforehand (``start_experiment``). ``keep_explicit``: keep the values
    the script set itself instead of replacing them. Raises ValueError when there is
    nothing to try, ExperimentError when the baseline fails, KeyboardInterrupt when
    stopped; the experiment row says so in each case.
    """
    _check_size(steps, trials)
    baseline_run = store.run(baseline_run_id)
    if not baseline_run.get("command"):
        raise ValueError(f"run {baseline_run_id} has no recorded command to re-run")
    planned = planning.choose_fixes(store, baseline_run_id, fixes, allow_numerics)
    if not planned:
        raise ValueError(
            f"no automatic fix is recommended for run {baseline_run_id}; "
            "name fixes to try explicitly"
        )
    config = {
        "fixes": [f.id for f in planned],
        "steps": steps,
        "trials": trials,
        "timeout_s": timeout_s,
        "allow_numerics": allow_numerics,
        "tolerance": tolerance,
        "seed": seed,
        "keep_explicit": keep_explicit,
        "command": baseline_run["command"],
        "cwd": baseline_run["cwd"],
        "planned": [f.to_json() for f in planned],
    }
    pid, started = os.getpid(), _own_create_time()
    if experiment_id is None:
        experiment_id = store.create_experiment(
            baseline_run_id, config, pid=pid, pid_started_at=started
        )
    else:
        store.update_experiment(
            experiment_id, config=config, pid=pid, pid_started_at=started, status="running"
        )
    runner = _Runner(store, experiment_id, baseline_run, planned, config, progress)
    try:
        result = runner.run()
    except BaseException as exc:
        error = "interrupted" if isinstance(exc, KeyboardInterrupt) else _one_line(exc)
        store.update_experiment(
            experiment_id,
            status="failed",
            error=error,
            ended_at=time.time(),
            result=runner.partial_result(),
        )
        raise
    store.update_experiment(experiment_id, status="completed", ended_at=time.time(), result=result)
    return result


class _Runner:
    """The state of one experiment while its trials run."""

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        baseline_run: dict[str, Any],
        planned: list[PlannedFix],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        self.store = store
        self.id = experiment_id
        self.base = baseline_run
        self.planned = planned
        self.config = config
        self.callback = progress
        self.baseline = Arm("baseline", "baseline", [])
        self.arms = [self.baseline, *candidate_arms(planned)]
        self.order: list[list[str]] = []
        self.done = 0
        self.total = len(self.arms) * config["trials"]
        self.timeouts = _Timeouts(config["timeout_s"], store, baseline_run, config["steps"])
        self.confirm_baseline = Arm("baseline", "baseline", [])
        self.confirm: Arm | None = None
        self.outcomes: dict[str, dict[str, Any]] = {}

    # -- running -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        trials = self.config["trials"]
        for k in range(trials):
            active = [a for a in self.arms if not a.failed]
            order = rotated(active, k)
            self.order.append([a.name for a in order])
            for arm in order:
                self._trial(arm, k, "trials")
        self.outcomes = {a.name: self._evaluate(a, self.baseline) for a in self.arms[1:]}
        per_fix = self._per_fix()
        kept = [f.id for f in self.planned if per_fix[f.id]["kept"]]
        best = self._best(kept)
        self._annotate(per_fix, best)
        return self._result(per_fix, best)

    def _annotate(self, per_fix: dict[str, dict[str, Any]], best: dict[str, Any]) -> None:
        """Kept means in the best candidate; notes for what the figures alone hide."""
        chosen = set(best["fixes"])
        trials = _figures(self.store, self.baseline.runs).median_step
        diagnosed = summarize_steps(self.store.steps(self.base["id"]))["step_time_median_s"]
        for entry in per_fix.values():
            notes = []
            if entry["kept"] and entry["id"] not in chosen:
                entry["kept"] = False
                notes.append(
                    f"faster on its own ({entry['measured']:.2f}x) but the best measured "
                    f"candidate is {best['candidate']} ({best['speedup']:.2f}x)"
                )
            bound = above_bound_note(entry, trials, diagnosed)
            if bound:
                notes.append(bound)
            entry["note"] = "; ".join(notes) or None

    def _trial(self, arm: Arm, k: int, phase: str) -> None:
        self._report("trial_start", arm, k, phase)
        base = self.base
        env = {
            key: value
            for key, value in ((base.get("env") or {}).get("vars") or {}).items()
            if key not in NOT_REPLAYED
        }
        env.update(planning.plan_env(arm.fixes, env))
        from stepscope.collectors.launcher import launch_run

        run_id, exit_code = launch_run(
            base["command"],
            name=f"{base['name']} [{arm.name} #{k + 1}]",
            max_steps=self.config["steps"],
            home=self.store.home,
            extra_env=env,
            parent_run_id=base["id"],
            config={
                "experiment": self.id,
                "arm": arm.name,
                "fixes": arm.fix_ids,
                "trial": k,
                "phase": phase,
            },
            cwd=base["cwd"],
            output_path=OUTPUT_LOG,
            timeout_s=self.timeouts.current(arm.fix_ids),
            quiet=True,
            plan=planning.plan_document(
                arm.fixes,
                seed=self.config["seed"],
                override_explicit=not self.config.get("keep_explicit", False),
            ),
        )
        arm.runs.append(run_id)
        run = self.store.run(run_id)
        self.done += 1
        if run["status"] == "interrupted":
            self._report("trial_end", arm, k, phase, run_id, run["status"])
            raise ExperimentInterrupted(f"trial run {run_id} was interrupted")
        error = _trial_error(self.store, run)
        if error is None and arm.kind == "baseline":
            self.timeouts.observe(run)
        if error is not None:
            if arm.kind == "baseline":
                self._report("trial_end", arm, k, phase, run_id, "failed", error)
                raise ExperimentError(f"the baseline failed (run {run_id}): {error}")
            arm.error, arm.failure, arm.failed_run = error, failure_kind(error), run_id
            # not run again: the remaining trials of this arm drop out of the total
            self.total -= self.config["trials"] - 1 - k
        elif arm.kind != "baseline":
            arm.not_applied = not_applied(arm.fix_ids, run.get("config"))
            if arm.not_applied:
                error = "not applied: " + "; ".join(
                    f"{x['fix']}: {x['why']}" for x in arm.not_applied
                )
                self.total -= self.config["trials"] - 1 - k
        status = "failed" if arm.error else ("not applied" if arm.not_applied else "ok")
        self._report("trial_end", arm, k, phase, run_id, status, error)

    def _report(
        self,
        event: str,
        arm: Arm,
        trial: int,
        phase: str,
        run_id: int | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> None:
        state = {
            "event": event,
            "done": self.done,
            "total": self.total,
            "arm": arm.name,
            "fixes": arm.fix_ids,
            "trial": trial,
            "trials": self.config["trials"],
            "phase": phase,
            "run_id": run_id,
            "status": status,
            "error": error,
            "runs": {a.name: list(a.runs) for a in self._all_arms()},
            "t": time.time(),
        }
        self.store.update_experiment(self.id, progress=state)
        if self.callback is not None:
            self.callback(state)

    def _all_arms(self) -> list[Arm]:
        extra = [self.confirm] if self.confirm is not None else []
        return [*self.arms, *extra]

    # -- judging -------------------------------------------------------------------------
    def _evaluate(self, arm: Arm, baseline: Arm, against: Arm | None = None) -> dict[str, Any]:
        """A candidate's figures against ``against`` (default: the baseline)."""
        ref = against or baseline
        out: dict[str, Any] = {
            "name": arm.name,
            "kind": arm.kind,
            "fixes": arm.fix_ids,
            "status": "failed" if arm.failed else "completed",
            "error": arm.error,
            "failure": arm.failure,
            "failed_run": arm.failed_run,
            "runs": list(arm.runs),
            "against": ref.name,
            "speedup": None,
            "ci": None,
            "verdict": None,
            "speedup_basis": None,
            "step_time": None,
            "samples_per_s": None,
            "quality_ok": None,
            "quality": None,
            "warmup": None,
            "not_applied": list(arm.not_applied),
        }
        if arm.not_applied and arm.error is None:
            out["status"] = NOT_APPLIED
            out["error"] = "not applied: " + "; ".join(
                f"{x['fix']}: {x['why']}" for x in arm.not_applied
            )
            return out
        if arm.failed:
            return out
        cand, base = _figures(self.store, arm.runs), _figures(self.store, ref.runs)
        out["warmup"] = cand.warmup()
        step_ci = _ci(base.step_times, cand.step_times)
        # samples/s is throughput: a ratio of means (see stats.py)
        sps_ci = _ci(base.sec_per_sample, cand.sec_per_sample, statistic="mean")
        out["step_time"] = _ci_json(step_ci, cand.median_step, base.median_step)
        out["samples_per_s"] = _ci_json(sps_ci)
        # The verdict is on throughput (samples/s) whenever batch sizes are known: it is
        # what the job's wall time follows, what the Amdahl bound bounds, and the only
        # comparable figure when a fix changes the batch size. The median step-time
        # ratio is reported beside it.
        headline, basis = step_ci, "step_time"
        if sps_ci is not None:
            headline, basis = sps_ci, "samples_per_s"
        if headline is None:
            out["status"] = "failed"
            out["error"] = "too few timed steps to compare (raise --steps)"
            return out
        out.update(
            speedup=round(headline.ratio, 4),
            ci=[round(headline.lo, 4), round(headline.hi, 4)],
            verdict=headline.verdict,
            speedup_basis=basis,
        )
        quality = check_quality(
            _losses(self.store, baseline.runs),
            _losses(self.store, arm.runs),
            self.config["tolerance"],
        )
        out["quality_ok"] = quality.ok
        out["quality"] = quality.to_json()
        return out

    def _per_fix(self) -> dict[str, dict[str, Any]]:
        """Predicted vs measured for each fix, and whether it is kept."""
        by_fixes = {tuple(sorted(a.fix_ids)): a for a in self.arms[1:]}
        out: dict[str, dict[str, Any]] = {}
        for fix in self.planned:
            own = by_fixes.get(tuple(sorted([fix.id] + ([fix.needs] if fix.needs else []))))
            outcome = self.outcomes.get(own.name) if own is not None else None
            measured: dict[str, Any] = {"speedup": None, "ci": None, "verdict": None}
            against = "baseline"
            if outcome is not None and fix.needs:
                # its own gain: over the fix it needs, run alone
                need_arm = by_fixes.get((fix.needs,))
                if need_arm is not None and not need_arm.failed and outcome["status"] != "failed":
                    marginal = self._evaluate(own, self.baseline, against=need_arm)
                    measured = _pick(marginal)
                    against = fix.needs
            elif outcome is not None:
                measured = _pick(outcome)
            quality_ok = outcome["quality_ok"] if outcome else None
            status = outcome["status"] if outcome else "not measured"
            why_not = None
            if status == NOT_APPLIED:
                status = "not applied"
                why_not = "; ".join(
                    x["why"] for x in outcome["not_applied"] if x["fix"] == fix.id
                ) or "; ".join(f"{x['fix']}: {x['why']}" for x in outcome["not_applied"])
            kept = (
                status == "completed" and measured["verdict"] == FASTER and quality_ok is not False
            )
            out[fix.id] = {
                "id": fix.id,
                "params": fix.params,
                "why_params": fix.why_params,
                "predicted": fix.predicted_speedup,
                "predicted_basis": fix.basis,
                **self._predicted_here(fix),
                "finding": fix.finding,
                "measured": measured["speedup"],
                "ci": measured["ci"],
                "verdict": measured["verdict"],
                "against": against,
                "candidate": own.name if own is not None else None,
                "status": status,
                "error": outcome["error"] if outcome else None,
                "quality_ok": quality_ok,
                "changes_numerics": fix.changes_numerics,
                "kept": kept,
                "not_applied_why": why_not,
                "note": None,
            }
        for fix in self.planned:  # a fix is only worth what the fix it needs is worth
            if fix.needs and not out[fix.needs]["kept"]:
                out[fix.id]["kept"] = False
        return out

    def _predicted_here(self, fix: Any) -> dict[str, Any]:
        """The bound again, from this experiment's own baseline trials.

        The diagnosed run may have been recorded under other load: on a shared 2-core
        machine its data-wait share was 54 % while the interleaved baseline trials
        waited 80 %, and the measured 4.4x then "beat" a 2.2x bound. The step timer
        measures data wait on every trial, so input-pipeline fixes get a bound from the
        same conditions the measurement had; the others keep the diagnosis' bound.
        """
        if fix.finding != "io/input_pipeline":
            return {"predicted_in_experiment": None, "predicted_in_experiment_basis": None}
        from stepscope import fixes as catalog
        from stepscope.analyzers.recommend import predict

        shares = [
            summarize_steps(steps)["data_wait_share"]
            for steps in (self.store.steps(r) for r in self.baseline.runs)
            if not steps.empty
        ]
        shares = [x for x in shares if x is not None]
        if not shares:
            return {"predicted_in_experiment": None, "predicted_in_experiment_basis": None}
        bound, basis = predict(catalog.get(fix.id), float(np.median(shares)))
        return {
            "predicted_in_experiment": bound,
            "predicted_in_experiment_basis": f"{basis} (data wait of the baseline trials)",
        }

    def _best(self, kept: list[str]) -> dict[str, Any]:
        """The fastest measured candidate made only of fixes worth keeping.

        The combination of all kept fixes is measured (its own arm, or a confirmation
        arm against baseline trials run beside it); a single fix that alone measured
        faster than the combination wins over it.
        """
        if not kept:
            return _no_best()
        wanted = tuple(sorted(kept))
        if not any(tuple(sorted(a.fix_ids)) == wanted for a in self.arms[1:]):
            self._confirm(kept)
        top = pick_best(list(self.outcomes.values()), set(kept))
        if top is None:
            return _no_best()
        return _best_from(top["fixes"], top, confirmed=top["name"] == "confirm")

    def _confirm(self, kept: list[str]) -> None:
        """Run the kept combination against the baseline once more (interleaved)."""
        self.confirm = Arm("confirm", "confirm", [f for f in self.planned if f.id in kept])
        self.total += 2 * self.config["trials"]
        for k in range(self.config["trials"]):
            for arm in rotated([self.confirm_baseline, self.confirm], k):
                if arm.failed:
                    continue
                self._trial(arm, k, "confirm")
        # against the baseline trials run beside it: the same drift hits both
        self.outcomes["confirm"] = self._evaluate(
            self.confirm, self.baseline, against=self.confirm_baseline
        )

    def _result(self, per_fix: dict[str, dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        base = _figures(self.store, self.baseline.runs)
        candidates = [self.outcomes[a.name] for a in self.arms[1:]]
        if self.confirm is not None:
            candidates.append(self.outcomes["confirm"])
        return {
            "experiment_id": self.id,
            "baseline_run": self.base["id"],
            "command": self.base["command"],
            "cwd": self.base["cwd"],
            "steps": self.config["steps"],
            "trials": self.config["trials"],
            "timeout_s": self.timeouts.current([]),  # per trial; + allowance to compile
            "tolerance": self.config["tolerance"],
            "seed": self.config["seed"],
            "arm_order": self.order,
            "baseline": {
                "runs": list(self.baseline.runs),
                "confirm_runs": list(self.confirm_baseline.runs),
                "step_time_median_s": base.median_step,
                "samples_per_s": base.samples_per_s,
                "warmup": base.warmup(),
            },
            "candidates": candidates,
            "fixes": list(per_fix.values()),
            "predicted": {k: v["predicted"] for k, v in per_fix.items()},
            "measured": {k: v["measured"] for k, v in per_fix.items()},
            "best": best,
            "keep_explicit": bool(self.config.get("keep_explicit")),
            "contention": contention(
                [self.store.samples(r) for a in self._all_arms() for r in a.runs]
            ),
        }

    def partial_result(self) -> dict[str, Any]:
        """What is known when the experiment stops early: the runs of each arm."""
        return {
            "experiment_id": self.id,
            "baseline_run": self.base["id"],
            "arm_order": self.order,
            "runs": {a.name: list(a.runs) for a in self._all_arms()},
            "errors": {a.name: a.error for a in self._all_arms() if a.failed},
        }


# -- arms and their order ----------------------------------------------------------------
def candidate_arms(planned: list[PlannedFix]) -> list[Arm]:
    """All fixes together, then each fix alone (with the fix it needs), without repeats."""
    arms = [Arm("all", "all", list(planned))]
    if len(planned) > 1:
        by_id = {f.id: f for f in planned}
        for fix in planned:
            fixes = [by_id[fix.needs], fix] if fix.needs else [fix]
            arms.append(Arm(fix.id, "alone", fixes))
    seen: set[tuple[str, ...]] = set()
    unique = []
    for arm in arms:
        key = tuple(sorted(arm.fix_ids))
        if key not in seen:
            seen.add(key)
            unique.append(arm)
    return unique


def rotated(arms: list[Arm], k: int) -> list[Arm]:
    """Trial ``k``'s order: the arms rotated by k (A B C, B C A, C A B, ...)."""
    if not arms:
        return []
    k %= len(arms)
    return arms[k:] + arms[:k]


# -- one arm's figures -------------------------------------------------------------------
@dataclass
class _Figures:
    step_times: np.ndarray
    sec_per_sample: np.ndarray | None
    batch: float | None
    warmups: list[tuple[int, float | None]]

    @property
    def median_step(self) -> float | None:
        return round(float(np.median(self.step_times)), 6) if self.step_times.size else None

    @property
    def samples_per_s(self) -> float | None:
        if self.sec_per_sample is None or not self.sec_per_sample.size:
            return None
        return round(1.0 / float(np.mean(self.sec_per_sample)), 3)  # throughput: a mean

    def warmup(self) -> dict[str, Any]:
        """Warm-up excluded from the figures: steps per trial and mean time."""
        times = [t for _, t in self.warmups if t is not None]
        return {
            "steps": max((n for n, _ in self.warmups), default=0),
            "time_s": round(float(np.mean(times)), 4) if times else None,
        }


def _figures(store: Any, runs: list[int]) -> _Figures:
    """Timed step times of an arm's trials pooled; warm-up left out of each trial."""
    times, per_sample, batches, warmups = [], [], [], []
    for run_id in runs:
        steps = store.steps(run_id)
        if steps.empty:
            continue
        times.append(timed_step_times(steps))
        summary = summarize_steps(steps)
        warmups.append((summary["warmup_steps"], summary["warmup_time_s"]))
        per_sample.append(sec_per_sample(steps))
        if per_sample[-1] is not None:
            batches.append(float(steps["batch_size"].median()))
    pooled = np.concatenate(times) if times else np.zeros(0)
    sps = None
    if per_sample and all(p is not None for p in per_sample):
        sps = np.concatenate(per_sample)
    batch = float(np.median(batches)) if batches and len(batches) == len(times) else None
    return _Figures(pooled, sps, batch, warmups)


def _losses(store: Any, runs: list[int]) -> list[np.ndarray]:
    return [loss_series(store.steps(run_id)) for run_id in runs]


def _ci(
    base: np.ndarray | None, cand: np.ndarray | None, statistic: str = "median"
) -> SpeedupCI | None:
    if base is None or cand is None:
        return None
    try:
        return speedup_ci(base, cand, statistic=statistic)
    except ValueError:  # fewer than 2 timed steps on a side
        return None


def _ci_json(
    ci: SpeedupCI | None, median: float | None = None, base_median: float | None = None
) -> dict[str, Any] | None:
    if ci is None:
        return None
    out = {
        "ratio": round(ci.ratio, 4),
        "ci": [round(ci.lo, 4), round(ci.hi, 4)],
        "verdict": ci.verdict,
        "n": [ci.n_baseline, ci.n_candidate],
        "text": ci.describe(),
    }
    if median is not None:
        out["median_s"] = median
        out["baseline_median_s"] = base_median
    return out


def pick_best(outcomes: list[dict[str, Any]], kept: set[str]) -> dict[str, Any] | None:
    """The fastest candidate that completed, measured faster, kept the loss and is made
    only of ``kept`` fixes; None when there is none."""
    pool = [
        o
        for o in outcomes
        if set(o["fixes"]) <= kept
        and o["status"] == "completed"
        and o["verdict"] == FASTER
        and o["quality_ok"] is not False
    ]
    return max(pool, key=lambda o: o["speedup"]) if pool else None


def _no_best() -> dict[str, Any]:
    return {"fixes": [], "speedup": None, "ci": None, "verdict": None, "candidate": None}


def _pick(outcome: dict[str, Any]) -> dict[str, Any]:
    return {k: outcome.get(k) for k in ("speedup", "ci", "verdict")}


def _best_from(fixes: list[str], outcome: dict[str, Any], confirmed: bool) -> dict[str, Any]:
    return {
        "fixes": list(fixes),
        "speedup": outcome["speedup"],
        "ci": outcome["ci"],
        "verdict": outcome["verdict"],
        "candidate": outcome["name"],
        "confirmed": confirmed,
    }


# -- how a trial ended -------------------------------------------------------------------
def _trial_error(store: Any, run: dict[str, Any]) -> str | None:
    """Why a trial run cannot be used; None when it ran its steps."""
    if run["status"] in ("completed", "stopped"):
        if len(timed_step_times(store.steps(run["id"]))) < 2:
            return "too few steps recorded (does the job train, and for long enough?)"
        return None
    error = run.get("error") or f"{run['status']} (exit code {run.get('exit_code')})"
    if run["status"] == "killed":
        error += " (out of host memory? the kernel's OOM killer sends SIGKILL)"
    return error


def failure_kind(error: str) -> str:
    """'hang' (timed out), 'oom' (out of memory) or 'crash'."""
    text = error.lower()
    if "timed out" in text:
        return "hang"
    if "out of memory" in text or "outofmemoryerror" in text:
        return "oom"
    return "crash"


class _Timeouts:
    """Per-trial timeout: the user's, or 5x the longest baseline trial (at least 60 s).

    Before the first baseline trial has run, the recorded baseline run stands in:
    its start-up plus ``steps`` of its median step time. An arm that compiles gets
    minutes more: compiling a model on a small CPU is a one-off cost, not a hang.
    """

    def __init__(
        self, explicit: float | None, store: Any, baseline_run: dict[str, Any], steps: int
    ) -> None:
        self.explicit = explicit
        self.longest: float | None = None
        self.estimate = _estimate_trial_s(store, baseline_run, steps)

    def observe(self, run: dict[str, Any]) -> None:
        if run.get("ended_at") and run.get("started_at"):
            wall = float(run["ended_at"]) - float(run["started_at"])
            self.longest = max(self.longest or 0.0, wall)

    def current(self, fixes: list[str]) -> float:
        if self.explicit is not None:
            value = float(self.explicit)
        else:
            reference = self.longest if self.longest is not None else self.estimate
            if reference is None:
                value = FALLBACK_TIMEOUT_S
            else:
                value = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * reference)
            if any(f in SLOW_START_FIXES for f in fixes):
                value += SLOW_START_ALLOWANCE_S
        return round(value, 1)


def _estimate_trial_s(store: Any, run: dict[str, Any], steps: int) -> float | None:
    """Seconds a trial of ``steps`` steps should take, from the recorded run."""
    started, ended = run.get("started_at"), run.get("ended_at")
    recorded = store.steps(run["id"])
    if started and not recorded.empty:
        startup = max(0.0, float(recorded["start_s"].min()) - float(started))
        median = float((recorded["end_s"] - recorded["start_s"]).median())
        return startup + steps * median
    if started and ended:
        return float(ended) - float(started)
    return None


# -- background use (the dashboard) ------------------------------------------------------
def _check_size(steps: int, trials: int) -> None:
    if steps < 2 or trials < 1:
        raise ValueError("an experiment needs at least 2 steps and 1 trial per arm")


def start_experiment(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    *,
    fixes: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    allow_numerics: bool = False,
    keep_explicit: bool = False,
) -> int:
    """Start an experiment in a background process; returns its id at once.

    The fixes are chosen here, in the caller, so that a request with nothing to try
    (or an unknown fix id) fails as a ValueError rather than in a process nobody
    watches. Progress and result are read with ``RunStore.experiment(id)``; the
    process's own output goes to ``<home>/experiments/<id>.log``.
    """
    from stepscope.store import RunStore

    _check_size(steps, trials)
    with RunStore(home) as store:
        planned = planning.choose_fixes(store, baseline_run_id, fixes, allow_numerics)
        if not planned:
            raise ValueError(f"no automatic fix is recommended for run {baseline_run_id}")
        config = {
            "fixes": [f.id for f in planned],
            "steps": steps,
            "trials": trials,
            "timeout_s": timeout_s,
            "allow_numerics": allow_numerics,
            "keep_explicit": keep_explicit,
        }
        experiment_id = store.create_experiment(baseline_run_id, config)
        store.update_experiment(experiment_id, progress={"event": "starting", "done": 0})
        log_dir = store.home / "experiments"
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "stepscope.optim_runner.experiment",
            "--home",
            str(store.home),
            "--experiment",
            str(experiment_id),
        ]
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with open(log_dir / f"{experiment_id}.log", "ab") as log:
            child = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the dashboard's request, not its signals
            )
        store.update_experiment(
            experiment_id, pid=child.pid, pid_started_at=_create_time(child.pid)
        )
    return experiment_id


def cancel_experiment(store: Any, experiment_id: int) -> bool:
    """Ask a running experiment to stop (SIGTERM); its running trial is ended as well."""
    row = store.experiment(experiment_id)
    if row["status"] != "running" or not row.get("pid"):
        return False
    try:
        os.kill(int(row["pid"]), signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _main(argv: list[str] | None = None) -> int:
    """``python -m stepscope.optim_runner.experiment``: run one experiment, result on stdout."""
    import json

    from stepscope.store import RunStore

    parser = argparse.ArgumentParser(prog="python -m stepscope.optim_runner.experiment")
    parser.add_argument("--home", required=True, help="run store directory")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline", help="baseline run (id, name or 'last')")
    which.add_argument("--experiment", type=int, help="an experiment created beforehand")
    parser.add_argument("--fixes", help="comma-separated fix ids (default: recommended)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--allow-numerics", action="store_true")
    parser.add_argument("--keep-explicit", action="store_true")
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # between trials; during one the launcher forwards it

    signal.signal(signal.SIGTERM, stop)
    with RunStore(args.home) as store:
        if args.experiment is not None:
            row = store.experiment(args.experiment)
            cfg = row["config"]
            options = {
                "baseline_run_id": int(row["baseline_run_id"]),
                "fixes": cfg.get("fixes"),
                "steps": int(cfg.get("steps") or DEFAULT_STEPS),
                "trials": int(cfg.get("trials") or DEFAULT_TRIALS),
                "timeout_s": cfg.get("timeout_s"),
                "allow_numerics": bool(cfg.get("allow_numerics")),
                "keep_explicit": bool(cfg.get("keep_explicit")),
                "experiment_id": args.experiment,
            }
        else:
            options = {
                "baseline_run_id": store.resolve_run(args.baseline),
                "fixes": args.fixes.split(",") if args.fixes else None,
                "steps": args.steps,
                "trials": args.trials,
                "timeout_s": args.timeout,
                "allow_numerics": args.allow_numerics,
                "keep_explicit": args.keep_explicit,
            }
        try:
            result = run_experiment(store, **options)
        except KeyboardInterrupt:
            return 130
        except (ValueError, ExperimentError) as exc:
            if args.experiment is not None:  # failed before run_experiment could say so
                with contextlib.suppress(Exception):
                    if store.experiment(args.experiment)["status"] == "running":
                        store.update_experiment(
                            args.experiment, status="failed", error=str(exc), ended_at=time.time()
                        )
            print(f"stepscope: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(result, indent=1))
    return 0


def _own_create_time() -> float | None:
    return _create_time(os.getpid())


def _create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = [
    "Arm",
    "ExperimentError",
    "cancel_experiment",
    "candidate_arms",
    "failure_kind",
    "pick_best",
    "rotated",
    "run_experiment",
    "start_experiment",
]

if __name__ == "__main__":
    sys.exit(_main())
