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
* **Latency is the step's wall time** (``analyzers/latency.py``): one batch, the data
  wait included; warm-up steps are left out of each trial (``timed_step_times``).
* **Stored as an experiment** (``config.kind = "sweep"``, the result's ``rows``): the
  dashboard follows it through the store. The figures: ``sweep_figures.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from stepscope.optim_runner.contention import contention
from stepscope.optim_runner.experiment import (
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    ExperimentError,
    ExperimentInterrupted,
    check_size,
    process_started_at,
)
from stepscope.optim_runner.failures import Timeouts, drop_if_failed, trial_error
from stepscope.optim_runner.output_guard import is_inference
from stepscope.optim_runner.plan import PlannedFix
from stepscope.optim_runner.sweep_figures import (
    FIX_ID,
    KNEE_SHARE,
    applied_batch,
    arm_figures,
    knee,
)
from stepscope.optim_runner.trials import Arm, launch_trial, rotated

SWEEP_KIND = "sweep"
SWEEPS = ("batch",)
DEFAULT_FACTORS = (1, 2, 4, 8)
MAX_FACTOR = 1024

Progress = Callable[[dict[str, Any]], None]


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
    factors: list[int] | tuple[int, ...] = DEFAULT_FACTORS,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    *,
    seed: int | None = 0,
    experiment_id: int | None = None,
) -> dict[str, Any]:
    """Run the sweep in the foreground; returns its result (also stored as the
    experiment's). ValueError: nothing to sweep; KeyboardInterrupt: stopped."""
    check_size(steps, trials)
    factors = sorted({int(f) for f in factors} | {1})
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
    pid, started = os.getpid(), process_started_at(os.getpid())
    if experiment_id is None:
        experiment_id = store.create_experiment(
            baseline_run_id, config, pid=pid, pid_started_at=started
        )
    else:
        store.update_experiment(
            experiment_id, config=config, pid=pid, pid_started_at=started, status="running"
        )
    sweep = _Sweep(store, experiment_id, base, config, progress)
    try:
        result = sweep.run()
    except BaseException as exc:
        error = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc).split("\n")[0]
        store.update_experiment(
            experiment_id,
            status="failed",
            error=error,
            ended_at=time.time(),
            result=sweep.partial(),
        )
        raise
    store.update_experiment(experiment_id, status="completed", ended_at=time.time(), result=result)
    return result


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


class _Sweep:
    """The state of one sweep while its trials run (the arms: one per factor)."""

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        base: dict[str, Any],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        self.store, self.id, self.base, self.config = store, experiment_id, base, config
        self.callback = progress
        self.factors: list[int] = config["factors"]
        self.arms = [_arm(f) for f in self.factors]
        self.order: list[list[str]] = []
        self.done = 0
        self.total = len(self.arms) * config["trials"]
        self.timeouts = Timeouts(config["timeout_s"], store, base, config["steps"])

    def run(self) -> dict[str, Any]:
        for k in range(self.config["trials"]):
            order = rotated([a for a in self.arms if not a.failed], k)
            self.order.append([a.name for a in order])
            for arm in order:
                self._trial(arm, k)
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

    def _trial(self, arm: Arm, k: int) -> None:
        self._report("trial_start", arm, k)
        run_id = launch_trial(
            self.store,
            self.id,
            self.base,
            arm,
            k,
            "sweep",
            self.config,
            self.timeouts.current(arm.fix_ids),
        )
        arm.runs.append(run_id)
        run = self.store.run(run_id)
        self.done += 1
        if run["status"] == "interrupted":
            self._report("trial_end", arm, k, run_id, run["status"])
            raise ExperimentInterrupted(f"trial run {run_id} was interrupted")
        if arm.kind == "baseline":
            error = trial_error(self.store, run)
            if error is not None:
                self._report("trial_end", arm, k, run_id, "failed", error)
                raise ExperimentError(f"the job as it is failed (run {run_id}): {error}")
            self.timeouts.observe(run)
        else:
            error = drop_if_failed(self.store, arm, run)
            if error is not None:
                self.total -= self.config["trials"] - 1 - k
        status = "failed" if arm.error else ("not applied" if arm.not_applied else "ok")
        self._report("trial_end", arm, k, run_id, status, error)

    def _report(
        self,
        event: str,
        arm: Arm,
        trial: int,
        run_id: int | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> None:
        state = {
            "event": event,
            "done": self.done,
            "total": self.total,
            "arm": arm.name,
            "fixes": [f"{f.id}(factor={f.params['factor']})" for f in arm.fixes],
            "trial": trial,
            "trials": self.config["trials"],
            "phase": "sweep",
            "run_id": run_id,
            "status": status,
            "error": error,
            "runs": {a.name: list(a.runs) for a in self.arms},
            "t": time.time(),
        }
        self.store.update_experiment(self.id, progress=state)
        if self.callback is not None:
            self.callback(state)

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

    def partial(self) -> dict[str, Any]:
        return {
            "kind": SWEEP_KIND,
            "experiment_id": self.id,
            "baseline_run": self.base["id"],
            "arm_order": self.order,
            "runs": {a.name: list(a.runs) for a in self.arms},
            "errors": {a.name: a.error for a in self.arms if a.failed},
        }


__all__ = [
    "DEFAULT_FACTORS",
    "SWEEP_KIND",
    "SWEEPS",
    "check_sweepable",
    "parse_factors",
    "run_sweep",
]
