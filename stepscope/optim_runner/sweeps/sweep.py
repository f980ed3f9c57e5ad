"""Batch-size sweep of an inference job: throughput and tail latency per batch size.

``stepscope optimize RUN --sweep batch [--batch-factors 1,2,4,8]`` re-runs an inference
job with its DataLoader's batch size multiplied by each factor (the ``larger_batch``
fix, its ``factor`` in the plan), interleaved as an experiment's arms are (A B C, B C A,
...), and reports per batch size: samples/s, p50 and p99 latency per batch, with
bootstrap 95 % intervals, and the *knee*: the smallest batch whose throughput is within
``KNEE_SHARE`` of the best. Past the knee a larger batch buys little throughput and
costs latency; the user picks from the curve.

Decisions, and why:

* **Inference jobs only, and no consent asked.** A larger batch changes what a training
  step sees (the learning rate, the noise of the gradient), so there it needs
  ``--allow-numerics``; an inference model in eval mode computes each sample's output
  on its own, so the batch size changes only how fast the answers come (up to the
  rounding of another kernel choice). A training job is refused with one line.
* **The applied batch size is read back** from each trial's ``config["applied"]`` (what
  the job's DataLoader was built with) and from the batch sizes its steps recorded; a
  factor that did not take effect (no DataLoader, a batch sampler) is "not applied",
  never measured, as in an experiment (``failures.drop_if_failed``).
* **Latency is the step's wall time** (``analyzers/steps/latency.py``): one batch, the data
  wait included; warm-up steps are left out of each trial (``timed_step_times``).
* **Stored as an experiment** (``config.kind = "sweep"``, the result's ``rows``): the
  dashboard follows it through the store. The figures: ``sweep_figures.py``.
"""

from __future__ import annotations

from typing import Any

from stepscope.analyzers.steps.generation import is_generation
from stepscope.optim_runner.experiment.experiment import DEFAULT_STEPS, DEFAULT_TRIALS, check_size
from stepscope.optim_runner.guards.output_guard import is_inference
from stepscope.optim_runner.sweeps.generation_sweep import (
    DEFAULT_BATCH_SIZES,
    check_generation_sweepable,
    run_generation_sweep,
)
from stepscope.optim_runner.sweeps.sweep_figures import (
    FIX_ID,
    KNEE_SHARE,
    applied_batch,
    arm_figures,
    knee,
)
from stepscope.optim_runner.trials.contention import contention
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trial_loop import Progress, TrialLoop, run_recorded
from stepscope.optim_runner.trials.trials import Arm

SWEEP_KIND = "sweep"
SWEEPS = ("batch",)
DEFAULT_FACTORS = (1, 2, 4, 8)
MAX_FACTOR = 1024


def parse_factors(text: str | None) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; 1 (the job as it is) always included; ValueError in
    one line for anything else."""
    if not text:
        return list(DEFAULT_FACTORS)
    try:
        factors = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"--batch-factors takes integers, e.g. 1,2,4,8 (got {text!r})") from None
    if not factors or min(factors) < 1 or max(factors) > MAX_FACTOR:
        raise ValueError(f"--batch-factors must be integers from 1 to {MAX_FACTOR} (got {text!r})")
    return sorted(factors | {1})


def check_sweepable(store: Any, run_id: int) -> dict[str, Any]:
    """The run, when a batch sweep can re-run it; else ValueError saying why (one line)."""
    if is_generation(store.steps(run_id)):
        return check_generation_sweepable(store, run_id)
    run = store.run(run_id)
    if not run.get("command"):
        raise ValueError(f"run {run_id} has no recorded command to re-run")
    if not is_inference(store, run_id):
        raise ValueError(
            f"run {run_id} is not an inference job (it steps an optimizer or runs backward): "
            "a batch-size sweep is for inference; for training try larger_batch with "
            "--allow-numerics"
        )
    loaders = (run.get("facts") or {}).get("dataloaders") or []
    if loaders and not any(ld.get("batch_size") for ld in loaders):
        raise ValueError(f"run {run_id}'s DataLoader has no batch size to multiply")
    return run


# -- running -------------------------------------------------------------------------------
def run_sweep(
    store: Any,
    baseline_run_id: int,
    factors: list[int] | tuple[int, ...] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    *,
    seed: int | None = 0,
    experiment_id: int | None = None,
) -> dict[str, Any]:
    """Run the sweep in the foreground; returns its result (also stored as the
    experiment's). ValueError: nothing to sweep; KeyboardInterrupt: stopped.

    ``factors``: the batch multipliers (None: the default); for a generation run, the
    batch sizes its requests are generated at (``generation_sweep.py``; ``steps`` is
    then the number of the job's requests recorded and replayed)."""
    check_size(steps, trials)
    if is_generation(store.steps(baseline_run_id)):
        return run_generation_sweep(
            store,
            baseline_run_id,
            factors or DEFAULT_BATCH_SIZES,
            prompts=steps,
            trials=trials,
            timeout_s=timeout_s,
            progress=progress,
            seed=seed,
            experiment_id=experiment_id,
        )
    factors = sorted({int(f) for f in (factors or DEFAULT_FACTORS)} | {1})
    base = check_sweepable(store, baseline_run_id)
    config = {
        "kind": SWEEP_KIND,
        "sweep": "batch",
        "factors": factors,
        "fixes": [FIX_ID],
        "steps": steps,
        "trials": trials,
        "timeout_s": timeout_s,
        "seed": seed,
        "keep_explicit": False,
        "command": base["command"],
        "cwd": base["cwd"],
    }
    return run_recorded(
        store,
        baseline_run_id,
        config,
        experiment_id,
        lambda eid: _Sweep(store, eid, base, config, progress),
    )


def _arm(factor: int) -> Arm:
    if factor == 1:
        return Arm("x1", "baseline", [])
    fix = PlannedFix(
        FIX_ID,
        params={"factor": factor},
        why_params=f"batch size x{factor} (the sweep)",
        changes_numerics=True,
        needs_consent=True,
    )
    return Arm(f"x{factor}", "alone", [fix])


class _Sweep(TrialLoop):
    """One sweep: an arm per factor, the job as it is (x1) first."""

    kind = SWEEP_KIND
    reference_failed = "the job as it is failed"

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        base: dict[str, Any],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        self.factors: list[int] = config["factors"]
        arms = [_arm(f) for f in self.factors]
        super().__init__(store, experiment_id, base, config, progress, arms)

    def run(self) -> dict[str, Any]:
        self._rounds("sweep")
        rows = [self._row(f, a) for f, a in zip(self.factors, self.arms, strict=True)]
        return {
            "kind": SWEEP_KIND,
            "sweep": "batch",
            "experiment_id": self.id,
            "baseline_run": self.base["id"],
            "command": self.base["command"],
            "cwd": self.base["cwd"],
            "steps": self.config["steps"],
            "trials": self.config["trials"],
            "factors": self.factors,
            "arm_order": self.order,
            "rows": rows,
            "knee": knee(rows),
            "knee_share": KNEE_SHARE,
            "numerics": "a larger batch does not change an inference model's per-sample "
            "outputs, so the sweep needs no --allow-numerics",
            "contention": contention([self.store.samples(r) for a in self.arms for r in a.runs]),
        }

    def _fix_labels(self, arm: Arm) -> list[str]:
        return [f"{f.id}(factor={f.params['factor']})" for f in arm.fixes]

    def _row(self, factor: int, arm: Arm) -> dict[str, Any]:
        row: dict[str, Any] = {
            "factor": factor,
            "arm": arm.name,
            "runs": list(arm.runs),
            "status": "completed",
            "error": arm.error,
            "batch_size": None,
            "applied": applied_batch(self.store, arm.runs),
        }
        if arm.failed:
            row["status"] = "not applied" if arm.not_applied and not arm.error else "failed"
            row["error"] = arm.error or "; ".join(x["why"] for x in arm.not_applied)
            return row
        row.update(arm_figures(self.store, arm.runs))
        return row


__all__ = [
    "DEFAULT_FACTORS",
    "SWEEP_KIND",
    "SWEEPS",
    "check_sweepable",
    "parse_factors",
    "run_sweep",
]
