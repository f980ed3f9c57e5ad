"""Experiments: re-run a recorded job with fixes applied, and prove (or disprove) the gain.

``run_experiment`` takes a baseline run from the store and re-runs its recorded command
(same cwd, same arguments, bounded to ``steps``) as several *arms*: the baseline itself,
every chosen fix together, and each fix alone (the ablation: which fix earned what).
Each arm runs at most ``trials`` times (fewer once its verdict is clear, unless
``full``); the result per candidate is the ratio of median step times (and of
samples/s) against the baseline with a bootstrap 95 % interval, and a quality guard on
the losses.

This module runs the experiment from start to end; the parts live beside it:

* ``options.py``: its options (``ExperimentOptions``), declared once for the CLI, the
  dashboard and the background process;
* ``trials.py``: the arms, their interleaved and rotated order, launching one trial;
* ``failures.py``: crashes, out-of-memory errors, hangs and time limits, fixes that did
  not take effect (a failing candidate costs only itself);
* ``verdict.py``: ratios, intervals, the fixes kept, notes on the result;
* ``leave_one_out.py``: from the fastest set, the fixes that earn its gain;
* ``adaptive.py``, ``design.py``: which arms stop early, when the experiment ends;
* ``repeats.py``: trials run again because other work competed for the cores;
* ``background.py``: an experiment in a background process (the dashboard).

Decisions taken here, and why:

* **A failing baseline ends the experiment**: there is nothing left to compare with;
  except one whose recorded run ran out of memory (``failures.ran_out_of_memory``): its
  baseline runs once more under the same limit, and if it runs out again each candidate
  runs under that limit and the result says which fit, with their peak and speed, and
  keeps the fastest that fits (``verdict/fits.py``); if it now completes, the experiment
  goes on as usual.
* **Fixes override what the script set** (``keep_explicit=False``, the default): the
  user asked to try them; the trial's log says what each replaced.
* **The kept combination is measured.** When no arm ran exactly the fixes worth
  keeping, a confirmation arm runs them against baseline trials run beside it.
* **The fastest set, then leave-one-out** (``leave_one_out.py``): when the fastest arm
  measured holds more than one fix, each fix is taken out of it in turn, interleaved
  with the set itself, until every fix left is needed; the answer is that smallest set,
  and each kept fix's share is the set with it against the set without it. A fix
  measured alone against a baseline whose bottleneck it does not address (compile on a
  job waiting on its loader) says nothing about what it earns once that is gone.
* **Adaptive by default** (``adaptive.py``, ``design.py``): after every round, once
  every arm has ``MIN_TRIALS`` trials, an arm whose interval is decided stops getting
  trials, and the experiment ends when the best candidate is clear or its budget
  (``budget_min``) would be overrun; ``full=True`` runs every trial as before.
* **Other work on the machine** during the trials is measured from the system samples
  and reported with a warning (``contention``); a trial it spoilt is run again, up to a
  limit (``repeats.py``).
* **Everything in the store.** The trial runs are ordinary runs linked to the baseline
  (``parent_run_id``, their arm in ``config``, the plan in their folder); the
  experiment row holds progress while it runs and the full result at the end, so a
  dashboard can follow an experiment started in another process.
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.steps.generation import is_generation
from stepscope.collectors.launch.memory_limit import MEMORY_LIMIT_KEY
from stepscope.optim_runner.experiment.adaptive import DEFAULT_BUDGET_MIN, budget_text
from stepscope.optim_runner.experiment.design import Design
from stepscope.optim_runner.experiment.leave_one_out import LEAVE_ONE_OUT, ONE_ROUND, LeaveOneOut
from stepscope.optim_runner.experiment.options import (
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    ExperimentOptions,
    check_size,
)
from stepscope.optim_runner.guards.output_guard import DEFAULT_RECORDED_CALLS, is_inference
from stepscope.optim_runner.trials import plan as planning
from stepscope.optim_runner.trials.contention import contention
from stepscope.optim_runner.trials.failures import ran_out_of_memory, trial_error
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.repeats import Repeats, default_limit
from stepscope.optim_runner.trials.trial_loop import (
    ExperimentError,
    ExperimentInterrupted,
    Progress,
    TrialLoop,
    process_started_at,
    run_recorded,
)
from stepscope.optim_runner.trials.trials import Arm, candidate_arms
from stepscope.optim_runner.verdict.fits import (
    fit_answer,
    fit_outcome,
    fit_per_fix,
    runs_out_text,
)
from stepscope.optim_runner.verdict.leave_one_out import fastest_set, keep_set, loo_best
from stepscope.optim_runner.verdict.peak_memory import (
    DEFAULT_MAX_SLOWDOWN,
    arm_peak,
    memory_best,
)
from stepscope.optim_runner.verdict.verdict import (
    annotate,
    best_from,
    evaluate,
    figures,
    no_best,
    per_fix,
    pick_best,
)

# The loop's names, imported from here by the CLI, the dashboard and the sweep.
__all__ = [
    "DEFAULT_BUDGET_MIN",
    "DEFAULT_STEPS",
    "DEFAULT_TRIALS",
    "ExperimentError",
    "ExperimentInterrupted",
    "ExperimentOptions",
    "Progress",
    "check_size",
    "process_started_at",
    "run_experiment",
]


# -- the experiment ----------------------------------------------------------------------
def run_experiment(
    store: Any,
    baseline_run_id: int,
    options: ExperimentOptions | None = None,
    progress: Progress | None = None,
    *,
    experiment_id: int | None = None,
) -> dict[str, Any]:
    """Run an experiment on ``baseline_run_id`` in the foreground; returns its result.

    ``options``: what to try and how (``options.py``, each field's help says what it
    does; None: the defaults). ``progress`` is called with a dict (done/total trials,
    current arm and trial) before and after every trial, and the same dict is stored as
    the experiment's progress. ``experiment_id``: an experiment row created beforehand
    (``background.start_experiment``). ``options.trials`` is the most per arm: the
    design is adaptive (``adaptive.py``: decided arms stop, the experiment ends when it
    knows or when ``budget_min``, default ``DEFAULT_BUDGET_MIN``, would be overrun)
    unless ``full`` (every trial, no budget).
    Raises ValueError when there is nothing to try or a budget is refused,
    ExperimentError when the baseline fails, KeyboardInterrupt when stopped; the
    experiment row says so in each case.
    """
    o = options or ExperimentOptions()
    o.check()
    baseline_run = store.run(baseline_run_id)
    if not baseline_run.get("command"):
        raise ValueError(f"run {baseline_run_id} has no recorded command to re-run")
    fixes = None if o.fixes is None else list(o.fixes)
    planned = planning.choose_fixes(store, baseline_run_id, fixes, o.allow_numerics, o.draft_model)
    oom = ran_out_of_memory(baseline_run)
    if oom and fixes is None:
        planned = planning.memory_fixes(planned)  # speed waits for a run that fits
    if not planned:
        raise ValueError(
            f"no automatic fix is recommended for run {baseline_run_id}; "
            "name fixes to try explicitly"
        )
    generation = is_generation(store.steps(baseline_run_id))
    answers_by_output = generation or is_inference(store, baseline_run_id)
    config = {
        "fixes": [f.id for f in planned],
        "steps": o.steps,
        "trials": o.trials,
        "timeout_s": o.timeout_s,
        "stall_s": o.stall_s,
        "allow_numerics": o.allow_numerics,
        "tolerance": o.tolerance,
        "seed": o.seed,
        "keep_explicit": o.keep_explicit,
        "draft_model": o.draft_model,
        "command": baseline_run["command"],
        "cwd": baseline_run["cwd"],
        "planned": [f.to_json() for f in planned],
        # an inference job is guarded by its outputs, a generation job by its generated
        # tokens, not by a loss (output_guard.py, token_guard.py)
        "record_outputs": DEFAULT_RECORDED_CALLS if answers_by_output else None,
        "generation": generation,
        "output_tolerance": o.output_tolerance,
        "min_agreement": o.min_agreement,
        "full": o.full,
        # a fix predicted to gain nothing alone gets an arm of its own only when asked for:
        # by --full, or by naming the fixes (trials.candidate_arms)
        "every_fix_alone": o.full or fixes is not None,
        "budget_min": None if o.full else (o.budget_min or DEFAULT_BUDGET_MIN),
        "busy_repeats": default_limit() if o.busy_repeats is None else max(0, o.busy_repeats),
        "goal": o.goal,
        "max_slowdown": o.max_slowdown or DEFAULT_MAX_SLOWDOWN,
        # a baseline that ran out of memory: which arms fit under its limit (verdict/fits.py)
        "oom_baseline": oom,
        "memory_limit": (baseline_run.get("config") or {}).get(MEMORY_LIMIT_KEY),
    }
    return run_recorded(
        store,
        baseline_run_id,
        config,
        experiment_id,
        lambda eid: _Runner(store, eid, baseline_run, planned, config, progress),
    )


# The phases of an experiment on a run that ran out of memory: the baseline once under
# its limit, then the candidates under the same limit.
OOM_CHECK = "oom_check"
FIT = "fit"


class _Runner(TrialLoop):
    """One experiment: the baseline, each candidate arm, and a confirmation arm when the
    fixes worth keeping were never measured together."""

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        baseline_run: dict[str, Any],
        planned: list[PlannedFix],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        self.baseline = Arm("baseline", "baseline", [])
        alone = bool(config.get("every_fix_alone", True))
        arms = [self.baseline, *candidate_arms(planned, full=alone)]
        super().__init__(store, experiment_id, baseline_run, config, progress, arms)
        self.planned = planned
        self.confirm_baseline = Arm("baseline", "baseline", [])
        self.confirm: Arm | None = None
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.design = Design(bool(config.get("full")), config.get("budget_min"), config["trials"])
        self.repeats = Repeats(int(config.get("busy_repeats") or 0))
        self.oom_check: dict[str, Any] | None = None  # the baseline's run under the limit
        self.loo = LeaveOneOut(self)  # from the fastest set: which fixes earn its gain
        self.loo_record: dict[str, Any] | None = None

    # -- running -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        if self.config.get("oom_baseline") and self._baseline_runs_out():
            return self._fit_result()
        self._rounds("trials")
        self.outcomes = {a.name: self._evaluate(a) for a in self.arms[1:]}
        fixes = per_fix(
            self.store,
            self.planned,
            self.arms[1:],
            self.outcomes,
            self.baseline,
            self.config["tolerance"],
        )
        if self.config.get("goal") == "memory":
            return self._result(fixes, self._least_memory(fixes))
        best = self._best([f.id for f in self.planned if fixes[f.id]["kept"]])
        start = fastest_set(list(self.outcomes.values()))
        if start is not None:  # which fixes of the fastest set earn its gain
            arms = {a.name: a for a in self._all_arms()}
            self.loo_record = self.loo.run(arms[start["name"]], start)
            best = loo_best(self.loo_record)
            keep_set(fixes, self.loo_record)
        annotate(self.store, fixes, best, self.baseline.runs, self.base["id"])
        return self._result(fixes, best)

    # -- a baseline that ran out of memory ----------------------------------------------
    def _baseline_runs_out(self) -> bool:
        """Run the baseline once under the recorded limit: does it still run out? If it
        completes, that trial leaves its arm (the experiment goes on as usual)."""
        self.total += 1
        self._trial(self.baseline, 0, OOM_CHECK)
        assert self.oom_check is not None
        if not self.oom_check["runs_out"]:
            return False
        self.baseline.stopped = "runs out of memory under the limit"
        self.total -= self.config["trials"]  # the baseline gets no trials
        self._rounds(FIT, self.arms[1:])
        return True

    def _counted(self, arm: Arm, run: dict[str, Any], k: int, phase: str) -> bool:
        if phase != OOM_CHECK or run["status"] == "interrupted":
            return super()._counted(arm, run, k, phase)
        error = trial_error(self.store, run)
        if error is not None and not ran_out_of_memory(run):
            return super()._counted(arm, run, k, phase)  # another failure ends it, as ever
        runs_out = error is not None
        self.oom_check = {"run": run["id"], "runs_out": runs_out, "error": error}
        if runs_out:
            note = f"{runs_out_text(self.config.get('memory_limit'))} again: which arms fit?"
            self._report("trial_end", arm, k, phase, run["id"], "runs out", error, note)
            return True
        arm.runs.remove(run["id"])  # kept in the store; the usual trials follow
        self.timeouts.observe(run)
        note = "the baseline completes under the limit now: the experiment goes on as usual"
        self.oom_check["note"] = note
        self._report("trial_end", arm, k, phase, run["id"], "ok", note=note)
        return True

    def _fit_result(self) -> dict[str, Any]:
        """The result of an experiment on a baseline that runs out: which arms fit, each
        with its peak and speed, and the fastest of them kept."""
        limit = self.config.get("memory_limit")
        self.outcomes = {a.name: fit_outcome(self.store, a) for a in self.arms[1:]}
        top, answer = fit_answer(limit, list(self.outcomes.values()))
        if top is None:
            best = {**no_best(), "goal": "fit", "fits": False, "answer": answer}
        else:
            best = {
                **no_best(),
                "fixes": list(top["fixes"]),
                "candidate": top["name"],
                "confirmed": False,
                "goal": "fit",
                "fits": True,
                "answer": answer,
                **{k: top[k] for k in ("peak_bytes", "samples_per_s", "steps_per_s", "speed")},
            }
        per_fix = fit_per_fix(self.planned, self.arms[1:], self.outcomes, best["fixes"])
        result = self._result(per_fix, best)
        result["goal"] = "fit"
        result["fits"] = [o for o in self.outcomes.values() if o.get("fits")]
        result["out_of_memory"] = {
            "limit_bytes": limit,
            "check_run": (self.oom_check or {}).get("run"),
            "runs_out": True,
            "error": (self.oom_check or {}).get("error"),
            "guard": "not checked: there is no baseline loss to compare with",
        }
        return result

    def _least_memory(self, per_fix: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """``--goal memory``: the candidate with the lowest peak within the slowdown
        allowed; its fixes are the ones kept, whatever their speed."""
        limit = float(self.config.get("max_slowdown") or DEFAULT_MAX_SLOWDOWN)
        top, answer = memory_best(list(self.outcomes.values()), limit)
        best = no_best() if top is None else best_from(top["fixes"], top, confirmed=False)
        for entry in per_fix.values():
            entry["kept"] = top is not None and entry["id"] in top["fixes"]
        chosen = {} if top is None else top
        return {
            **best,
            "goal": "memory",
            "max_slowdown": limit,
            "peak_ratio": chosen.get("peak_ratio"),
            "trade": chosen.get("trade"),
            "answer": answer,
        }

    def _evaluate(self, arm: Arm, against: Arm | None = None) -> dict[str, Any]:
        out = evaluate(
            self.store,
            arm,
            self.baseline,
            self.config["tolerance"],
            against,
            limits=self.config,  # the output guard's limits, for an inference job
        )
        out["stopped"] = arm.stopped  # why it got fewer trials (the adaptive design)
        return out

    def _why_ended(self, phase: str) -> str | None:
        return self.design.ended.get(phase)

    def _between_rounds(self, phase: str, k: int, arms: list[Arm]) -> bool:
        if phase == LEAVE_ONE_OUT:
            return self._loo_round_runs(arms)
        if phase == FIT:  # no baseline to judge against: every round the budget holds
            running = [a.name for a in arms if a.runnable]
            if self.design.budget_allows(running, self.trial_s):
                return True
            self.design.ended[FIT] = budget_text(self.design.budget_min or 0.0)
            return False
        against = None if arms[0] is self.baseline else arms[0]  # the confirmation's own
        return self.design.between_rounds(
            phase,
            arms,
            lambda arm: self._evaluate(arm, against),
            self.trial_s,
            lambda arm, why: self._stop(arm, why, k),
        )

    def _loo_round_runs(self, arms: list[Arm]) -> bool:
        """Leave-one-out rounds: one decides (every arm is needed or not) unless --full;
        no round the budget cannot hold."""
        if not self.design.full:
            self.design.ended[LEAVE_ONE_OUT] = ONE_ROUND
            return False
        running = [a.name for a in arms if a.runnable]
        if self.design.budget_allows(running, self.trial_s):
            return True
        self.design.ended[LEAVE_ONE_OUT] = budget_text(self.design.budget_min or 0.0)
        return False

    def _before_trial(self, phase: str, arm: Arm, arms: list[Arm]) -> str | None:
        if phase != "trials":  # the confirmation's two arms always run
            return None
        return self.design.before_trial(arm, arms, self._evaluate)

    def baselines(self) -> list[Arm]:
        """The baseline's arms: the first round's, and the confirmation's own."""
        return [self.baseline, self.confirm_baseline]

    def _all_arms(self) -> list[Arm]:
        extra = [self.confirm] if self.confirm is not None else []
        return [*self.arms, *extra, *self.loo.arms]

    # -- the best candidate --------------------------------------------------------------
    def _best(self, kept: list[str]) -> dict[str, Any]:
        """The fastest measured candidate made only of fixes worth keeping.

        The combination of all kept fixes is measured (its own arm, or a confirmation
        arm against baseline trials run beside it); a single fix that alone measured
        faster than the combination wins over it. Leave-one-out from the fastest set
        (``run``) then decides which fixes of it earn their place.
        """
        if not kept:
            return no_best()
        wanted = tuple(sorted(kept))
        if not any(tuple(sorted(a.fix_ids)) == wanted for a in self.arms[1:]):
            self._confirm(kept)
        top = pick_best(list(self.outcomes.values()), set(kept))
        if top is None:
            return no_best()
        return best_from(top["fixes"], top, confirmed=top["name"] == "confirm")

    def _confirm(self, kept: list[str]) -> None:
        """Run the kept combination against the baseline once more (interleaved), unless
        the budget cannot hold a round of it."""
        if not self.design.budget_allows(["baseline", "confirm"], self.trial_s):
            self.design.ended["confirm"] = (
                f"{budget_text(self.design.budget_min or 0.0)}: "
                "the kept fixes were not measured together"
            )
            return
        self.confirm = Arm("confirm", "confirm", [f for f in self.planned if f.id in kept])
        self.total += 2 * self.config["trials"]
        self._rounds("confirm", [self.confirm_baseline, self.confirm], record=False)
        # against the baseline trials run beside it: the same drift hits both
        self.outcomes["confirm"] = self._evaluate(self.confirm, against=self.confirm_baseline)

    # -- the result ----------------------------------------------------------------------
    def _result(self, per_fix: dict[str, dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
        base = figures(self.store, self.baseline.runs)
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
            "stall_s": self.timeouts.stall([]),  # the same
            "tolerance": self.config["tolerance"],
            "guard": (
                "tokens"
                if self.config.get("generation")
                else "outputs"
                if self.config.get("record_outputs")
                else "loss"
            ),
            "output_tolerance": self.config.get("output_tolerance"),
            "min_agreement": self.config.get("min_agreement"),
            "seed": self.config["seed"],
            "arm_order": self.order,
            "baseline": {
                "runs": list(self.baseline.runs),
                "confirm_runs": list(self.confirm_baseline.runs),
                "step_time_median_s": base.median_step,
                "samples_per_s": base.samples_per_s,
                "warmup": base.warmup(),
                "peak_bytes": arm_peak(self.store, self.baseline.runs)[0],
            },
            "candidates": candidates,
            "fixes": list(per_fix.values()),
            "predicted": {k: v["predicted"] for k, v in per_fix.items()},
            "measured": {k: v["measured"] for k, v in per_fix.items()},
            "best": best,
            "keep_explicit": bool(self.config.get("keep_explicit")),
            # of the counted trials: a repeated one is in "repeated", not in any arm's runs
            "contention": contention(
                [self.store.samples(r) for a in self._all_arms() for r in a.runs]
            ),
            "design": self.design.to_json(self.rounds),
            "leave_one_out": self.loo_record,
            "repeated": self.repeats.to_json(),
            "goal": self.config.get("goal", "time"),
            "max_slowdown": self.config.get("max_slowdown"),
            # the recorded run ran out of memory: its baseline's run under the limit
            "out_of_memory": None
            if self.oom_check is None
            else {
                "limit_bytes": self.config.get("memory_limit"),
                "check_run": self.oom_check["run"],
                "runs_out": self.oom_check["runs_out"],
                "note": self.oom_check.get("note"),
            },
        }
