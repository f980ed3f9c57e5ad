"""Experiments: re-run a recorded job with fixes applied, and prove (or disprove) the gain.

``run_experiment`` takes a baseline run from the store and re-runs its recorded command
(same cwd, same arguments, bounded to ``steps``) as several *arms*: the baseline itself,
every chosen fix together, and each fix alone (the ablation: which fix earned what).
Each arm runs at most ``trials`` times (fewer once its verdict is clear, unless
``full``); the result per candidate is the ratio of median step times (and of
samples/s) against the baseline with a bootstrap 95 % interval, and a quality guard on
the losses.

This module runs the experiment from start to end; the parts live beside it:

* ``trials.py``: the arms, their interleaved and rotated order, launching one trial;
* ``failures.py``: crashes, out-of-memory errors, hangs and time limits, fixes that did
  not take effect (a failing candidate costs only itself);
* ``verdict.py``: ratios, intervals, the fixes kept, notes on the result;
* ``adaptive.py``, ``design.py``: which arms stop early, when the experiment ends;
* ``repeats.py``: trials run again because other work competed for the cores;
* ``background.py``: an experiment in a background process (the dashboard).

Decisions taken here, and why:

* **A failing baseline ends the experiment**: there is nothing left to compare with.
* **Fixes override what the script set** (``keep_explicit=False``, the default): the
  user asked to try them; the trial's log says what each replaced.
* **The kept combination is measured.** When no arm ran exactly the fixes worth
  keeping, a confirmation arm runs them against baseline trials run beside it.
* **More fixes can beat the kept ones** (``stacked.py``): an arm that holds the kept
  fixes and more, measured clearly faster than their best candidate, becomes the best
  (fixes that pay only once another bottleneck is gone).
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
from stepscope.optim_runner import plan as planning
from stepscope.optim_runner.adaptive import DEFAULT_BUDGET_MIN, budget_text, check_budget
from stepscope.optim_runner.contention import contention
from stepscope.optim_runner.design import Design
from stepscope.optim_runner.output_guard import DEFAULT_RECORDED_CALLS, check_limits, is_inference
from stepscope.optim_runner.plan import PlannedFix
from stepscope.optim_runner.repeats import Repeats, default_limit
from stepscope.optim_runner.stacked import keep_together, over_json, wider_best
from stepscope.optim_runner.trial_loop import (
    ExperimentError,
    ExperimentInterrupted,
    Progress,
    TrialLoop,
    process_started_at,
    run_recorded,
)
from stepscope.optim_runner.trials import Arm, candidate_arms
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
    "DEFAULT_BUDGET_MIN",
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
    budget_min: float | None = None,
    full: bool = False,
    busy_repeats: int | None = None,
    stall_s: float | None = None,
) -> dict[str, Any]:
    """Run an experiment on ``baseline_run_id`` in the foreground; returns its result.

    ``fixes``: fix ids to try (default: the run's recommended auto fixes); ``timeout_s``:
    per trial (default: from the baseline's length); ``stall_s``: seconds without a new
    step before a trial that has stepped counts as hung (default: from the baseline's
    longest wait between steps); ``progress`` is called with a dict
    (done/total trials, current arm and trial) before and after every trial, and the
    same dict is stored as the experiment's progress. ``experiment_id``: an experiment
    row created beforehand (``background.start_experiment``). ``keep_explicit``: keep
    the values the script set itself instead of replacing them. ``output_tolerance``,
    ``min_agreement``: the output guard's limits for an inference job (None: defaults,
    ``output_guard.py``). ``trials`` is the most per arm: the design is adaptive
    (``adaptive.py``: decided arms stop, the experiment ends when it knows or when
    ``budget_min``, default ``DEFAULT_BUDGET_MIN``, would be overrun) unless ``full``
    (every trial, no budget). ``busy_repeats``: trials run again because other work
    competed, at most, per experiment (default ``repeats.default_limit()``; 0: none).
    Raises ValueError when there is nothing to try or a budget is refused,
    ExperimentError when the baseline fails, KeyboardInterrupt when stopped; the
    experiment row says so in each case.
    """
    check_size(steps, trials)
    check_budget(budget_min, full)
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
        "stall_s": stall_s,
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
        "full": full,
        "budget_min": None if full else (budget_min or DEFAULT_BUDGET_MIN),
        "busy_repeats": default_limit() if busy_repeats is None else max(0, busy_repeats),
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
        self.design = Design(bool(config.get("full")), config.get("budget_min"), config["trials"])
        self.repeats = Repeats(int(config.get("busy_repeats") or 0))

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
        best = self._best(kept, {f for f, e in fixes.items() if e["verdict"] == "slower"})
        annotate(self.store, fixes, best, self.baseline.runs, self.base["id"])
        keep_together(fixes, best)
        return self._result(fixes, best)

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
        against = None if arms[0] is self.baseline else arms[0]  # the confirmation's own
        return self.design.between_rounds(
            phase,
            arms,
            lambda arm: self._evaluate(arm, against),
            self.trial_s,
            lambda arm, why: self._stop(arm, why, k),
        )

    def _before_trial(self, phase: str, arm: Arm, arms: list[Arm]) -> str | None:
        if phase != "trials":  # the confirmation's two arms always run
            return None
        return self.design.before_trial(arm, arms, self._evaluate)

    def _all_arms(self) -> list[Arm]:
        extra = [self.confirm] if self.confirm is not None else []
        return [*self.arms, *extra]

    # -- the best candidate --------------------------------------------------------------
    def _best(self, kept: list[str], slower_alone: set[str]) -> dict[str, Any]:
        """The fastest measured candidate made only of fixes worth keeping, unless an arm
        with more fixes measured clearly faster than it (``stacked.py``).

        The combination of all kept fixes is measured (its own arm, or a confirmation
        arm against baseline trials run beside it); a single fix that alone measured
        faster than the combination wins over it.
        """
        top = None
        if kept:
            wanted = tuple(sorted(kept))
            if not any(tuple(sorted(a.fix_ids)) == wanted for a in self.arms[1:]):
                self._confirm(kept)
            top = pick_best(list(self.outcomes.values()), set(kept))
        arms = {a.name: a for a in self._all_arms()}
        wider = wider_best(
            list(self.outcomes.values()),
            top,
            lambda o: self._evaluate(arms[o["name"]], against=arms[top["name"]]),
            slower_alone,
        )
        if wider is not None:  # more fixes, measured clearly faster than the kept ones
            arm, over = wider
            return {**best_from(arm["fixes"], arm, confirmed=False), "over": over_json(top, over)}
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
            "repeated": self.repeats.to_json(),
        }
