"""Experiments: re-run a recorded job with fixes applied, and prove (or disprove) the gain.

``run_experiment`` takes a baseline run from the store and re-runs its recorded command
(same cwd, same arguments, bounded to ``steps``) as several *arms*: the baseline itself,
every chosen fix together, and each fix alone (the ablation: which fix earned what).
Each arm runs ``trials`` times; the result per candidate is the ratio of median step
times (and of samples/s) against the baseline with a bootstrap 95 % interval, and a
quality guard on the losses.

This module runs the experiment from start to end; the parts live beside it:

* ``trials.py``: the arms, their interleaved and rotated order, launching one trial;
* ``failures.py``: crashes, out-of-memory errors, hangs and time limits, fixes that did
  not take effect (a failing candidate costs only itself);
* ``verdict.py``: ratios, intervals, the fixes kept, notes on the result;
* ``background.py``: an experiment in a background process (the dashboard).

Decisions taken here, and why:

* **A failing baseline ends the experiment**: there is nothing left to compare with.
* **Fixes override what the script set** (``keep_explicit=False``, the default): the
  user asked to try them; the trial's log says what each replaced.
* **The kept combination is measured.** When no arm ran exactly the fixes worth
  keeping, a confirmation arm runs them against baseline trials run beside it.
* **Other work on the machine** during the trials is measured from the system samples
  and reported with a warning (``contention``).
* **Everything in the store.** The trial runs are ordinary runs linked to the baseline
  (``parent_run_id``, their arm in ``config``, the plan in their folder); the
  experiment row holds progress while it runs and the full result at the end, so a
  dashboard can follow an experiment started in another process.
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.generation import is_generation
from stepscope.optim_runner import plan as planning
from stepscope.optim_runner.contention import contention
from stepscope.optim_runner.output_guard import DEFAULT_RECORDED_CALLS, check_limits, is_inference
from stepscope.optim_runner.plan import PlannedFix
from stepscope.optim_runner.trial_loop import (
    ExperimentError,
    ExperimentInterrupted,
    Progress,
    TrialLoop,
    process_started_at,
    run_recorded,
)
from stepscope.optim_runner.trials import Arm, candidate_arms, rotated
from stepscope.optim_runner.verdict import (
    annotate,
    best_from,
    evaluate,
    figures,
    no_best,
    per_fix,
    pick_best,
)

DEFAULT_STEPS = 30
DEFAULT_TRIALS = 3

# The loop's names, imported from here by the CLI, the dashboard and the sweep.
__all__ = [
    "DEFAULT_STEPS",
    "DEFAULT_TRIALS",
    "ExperimentError",
    "ExperimentInterrupted",
    "Progress",
    "check_size",
    "process_started_at",
    "run_experiment",
]


def check_size(steps: int, trials: int) -> None:
    if steps < 2 or trials < 1:
        raise ValueError("an experiment needs at least 2 steps and 1 trial per arm")


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
    output_tolerance: float | None = None,
    min_agreement: float | None = None,
    draft_model: str | None = None,
) -> dict[str, Any]:
    """Run an experiment on ``baseline_run_id`` in the foreground; returns its result.

    ``fixes``: fix ids to try (default: the run's recommended auto fixes); ``timeout_s``:
    per trial (default: from the baseline's length); ``progress`` is called with a dict
    (done/total trials, current arm and trial) before and after every trial, and the
    same dict is stored as the experiment's progress. ``experiment_id``: an experiment
    row created beforehand (``background.start_experiment``). ``keep_explicit``: keep
    the values the script set itself instead of replacing them. ``output_tolerance``,
    ``min_agreement``: the output guard's limits for an inference job (None: defaults,
    ``output_guard.py``). Raises ValueError when
    there is nothing to try, ExperimentError when the baseline fails, KeyboardInterrupt
    when stopped; the experiment row says so in each case.
    """
    check_size(steps, trials)
    check_limits(output_tolerance, min_agreement)
    baseline_run = store.run(baseline_run_id)
    if not baseline_run.get("command"):
        raise ValueError(f"run {baseline_run_id} has no recorded command to re-run")
    planned = planning.choose_fixes(store, baseline_run_id, fixes, allow_numerics, draft_model)
    if not planned:
        raise ValueError(
            f"no automatic fix is recommended for run {baseline_run_id}; "
            "name fixes to try explicitly"
        )
    generation = is_generation(store.steps(baseline_run_id))
    answers_by_output = generation or is_inference(store, baseline_run_id)
    config = {
        "fixes": [f.id for f in planned],
        "steps": steps,
        "trials": trials,
        "timeout_s": timeout_s,
        "allow_numerics": allow_numerics,
        "tolerance": tolerance,
        "seed": seed,
        "keep_explicit": keep_explicit,
        "draft_model": draft_model,
        "command": baseline_run["command"],
        "cwd": baseline_run["cwd"],
        "planned": [f.to_json() for f in planned],
        # an inference job is guarded by its outputs, a generation job by its generated
        # tokens, not by a loss (output_guard.py, token_guard.py)
        "record_outputs": DEFAULT_RECORDED_CALLS if answers_by_output else None,
        "generation": generation,
        "output_tolerance": output_tolerance,
        "min_agreement": min_agreement,
    }
    return run_recorded(
        store,
        baseline_run_id,
        config,
        experiment_id,
        lambda eid: _Runner(store, eid, baseline_run, planned, config, progress),
    )


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
        arms = [self.baseline, *candidate_arms(planned)]
        super().__init__(store, experiment_id, baseline_run, config, progress, arms)
        self.planned = planned
        self.confirm_baseline = Arm("baseline", "baseline", [])
        self.confirm: Arm | None = None
        self.outcomes: dict[str, dict[str, Any]] = {}

    # -- running -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
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
        kept = [f.id for f in self.planned if fixes[f.id]["kept"]]
        best = self._best(kept)
        annotate(self.store, fixes, best, self.baseline.runs, self.base["id"])
        return self._result(fixes, best)

    def _evaluate(self, arm: Arm, against: Arm | None = None) -> dict[str, Any]:
        return evaluate(
            self.store,
            arm,
            self.baseline,
            self.config["tolerance"],
            against,
            limits=self.config,  # the output guard's limits, for an inference job
        )

    def _all_arms(self) -> list[Arm]:
        extra = [self.confirm] if self.confirm is not None else []
        return [*self.arms, *extra]

    # -- the best candidate --------------------------------------------------------------
    def _best(self, kept: list[str]) -> dict[str, Any]:
        """The fastest measured candidate made only of fixes worth keeping.

        The combination of all kept fixes is measured (its own arm, or a confirmation
        arm against baseline trials run beside it); a single fix that alone measured
        faster than the combination wins over it.
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
        """Run the kept combination against the baseline once more (interleaved)."""
        self.confirm = Arm("confirm", "confirm", [f for f in self.planned if f.id in kept])
        self.total += 2 * self.config["trials"]
        for k in range(self.config["trials"]):
            for arm in rotated([self.confirm_baseline, self.confirm], k):
                if arm.failed:
                    continue
                self._trial(arm, k, "confirm")
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
