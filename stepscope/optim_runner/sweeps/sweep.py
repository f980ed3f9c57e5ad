"""Batch-size sweep: throughput and tail latency per batch size, and for a training job
the largest batch that fits in memory.

``stepscope optimize RUN --sweep batch [--batch-factors 1,2,4,8]`` re-runs a job with its
batch size multiplied by each factor, and reports per batch size: samples/s, p50 and p99
latency per batch, with bootstrap 95 % intervals, the peak memory of its trials, and the
*knee*: the smallest batch whose throughput is within ``KNEE_SHARE`` of the best. Past
the knee a larger batch buys little throughput and mostly adds latency.

* **How the batch changes.** An inference job's DataLoader is rebuilt with the larger
  batch (the ``larger_batch`` fix at each factor). A training job's batch-size flag on its
  command line (``batch_flag.py``: ``--batch-size 32`` becomes ``--batch-size 64``) where
  it has one, else its DataLoader's. The applied batch size is read back from each
  trial's ``config["applied"]`` and from the batch sizes its steps recorded; a factor that
  did not take effect (no DataLoader, a batch sampler) is "not applied", never measured,
  as in an experiment (``failures.drop_if_failed``).
* **No consent asked.** A larger batch does not change an inference model's per-sample
  outputs; a training job's learning changes with its batch, but the sweep only measures:
  nothing of the job is kept, and the result says so.
* **The largest batch that fits** (training, ``largest_batch.py``): peak memory fitted
  against the batch, predicted under the memory limit (``--memory-limit``, the run's, or
  the GPU's) and confirmed by running it (``_TrainingSweep``).
* **One curve per memory fix** (training, ``--fixes``: fixes that free memory, such as
  ``activation_checkpointing``): every batch size runs again with the fix applied, in
  the same interleaved rounds as the job as it is, and each curve gets its own largest
  batch (``result["curves"]``): the batch each fix allows, measured, not predicted.
* **Latency is the step's wall time** (``analyzers/steps/latency.py``): one batch, the data
  wait included; warm-up steps are left out of each trial (``timed_step_times``).
* **Stored as an experiment** (``config.kind = "sweep"``, the result's ``rows``): the
  dashboard follows it through the store. The figures: ``sweep_figures.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analyzers.steps.generation import is_generation
from stepscope.collectors.launch.memory_limit import MEMORY_LIMIT_KEY
from stepscope.optim_runner.experiment.experiment import DEFAULT_STEPS, DEFAULT_TRIALS, check_size
from stepscope.optim_runner.guards.output_guard import is_inference
from stepscope.optim_runner.sweeps.batch_flag import BatchFlag, find_batch_flag
from stepscope.optim_runner.sweeps.generation_sweep import (
    DEFAULT_BATCH_SIZES,
    check_generation_sweepable,
    run_generation_sweep,
)
from stepscope.optim_runner.sweeps.largest_batch import (
    MAX_CONFIRMS,
    answer,
    fit_peak,
    memory_basis,
    next_size,
    predict,
    trial_peak,
)
from stepscope.optim_runner.sweeps.memory_curves import (
    FIXES_FOR_TRAINING,
    memory_curve_fixes,
    with_fixes,
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
LIMIT_FOR_TRAINING = "--memory-limit is for a training job's sweep (its largest batch)"


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


def check_sweepable(store: Any, run_id: int, memory_limit: int | None = None) -> dict[str, Any]:
    """The run, when a batch sweep can re-run it (under ``memory_limit`` bytes, where
    given); else ValueError saying why (one line)."""
    if is_generation(store.steps(run_id)):
        if memory_limit is not None:
            raise ValueError(LIMIT_FOR_TRAINING)
        return check_generation_sweepable(store, run_id)
    run = store.run(run_id)
    if not run.get("command"):
        raise ValueError(f"run {run_id} has no recorded command to re-run")
    loaders = (run.get("facts") or {}).get("dataloaders") or []
    sized = any(ld.get("batch_size") for ld in loaders)
    if is_inference(store, run_id):
        if loaders and not sized:
            raise ValueError(f"run {run_id}'s DataLoader has no batch size to multiply")
        if memory_limit is not None:
            raise ValueError(LIMIT_FOR_TRAINING)
    elif find_batch_flag(run["command"]) is None and not sized:
        raise ValueError(
            f"run {run_id} has no batch size to change: no batch-size flag in its command "
            "(--batch-size N, --batch_size N, --batch N, ...) and no DataLoader with a batch size"
        )
    if memory_limit is not None and (run.get("device") or {}).get("device_memory_bytes"):
        raise ValueError(
            "--memory-limit caps a CPU job's address space; a GPU job's limit is its "
            "device's memory"
        )
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
    memory_limit: int | None = None,
    fixes: list[str] | None = None,
) -> dict[str, Any]:
    """Run the sweep in the foreground; returns its result (also stored as the
    experiment's). ValueError: nothing to sweep; KeyboardInterrupt: stopped.

    ``factors``: the batch multipliers (None: the default); for a generation run, the
    batch sizes its requests are generated at (``generation_sweep.py``; ``steps`` is
    then the number of the job's requests recorded and replayed). ``memory_limit``
    (bytes, a CPU training job): the address space every trial runs under and its largest
    batch must fit in, instead of the run's own ``--memory-limit``. ``fixes``: memory
    fixes of a training sweep, one curve each (``memory_curve_fixes``)."""
    check_size(steps, trials)
    if is_generation(store.steps(baseline_run_id)):
        if memory_limit is not None:
            raise ValueError(LIMIT_FOR_TRAINING)
        if fixes:
            raise ValueError(FIXES_FOR_TRAINING)
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
    base = check_sweepable(store, baseline_run_id, memory_limit)
    training = not is_inference(store, baseline_run_id)
    if fixes and not training:
        raise ValueError(FIXES_FOR_TRAINING)
    curve_fixes = memory_curve_fixes(fixes)
    flag = find_batch_flag(base["command"]) if training else None
    config = {
        "kind": SWEEP_KIND,
        "sweep": "batch",
        "factors": factors,
        "fixes": [] if flag else [FIX_ID],
        "steps": steps,
        "trials": trials,
        "timeout_s": timeout_s,
        "seed": seed,
        "keep_explicit": False,
        "command": base["command"],
        "cwd": base["cwd"],
        "training": training,
        "batch_flag": flag.flag if flag else None,
        MEMORY_LIMIT_KEY: memory_limit,  # None: the run's own, if any (trials.launch_trial)
        "memory_fixes": curve_fixes,  # one more curve each (training)
    }
    make = _TrainingSweep if training else _Sweep
    return run_recorded(
        store,
        baseline_run_id,
        config,
        experiment_id,
        lambda eid: make(store, eid, base, config, progress),
    )


def _fix_arm(name: str, params: dict[str, Any], why: str) -> Arm:
    fix = PlannedFix(
        FIX_ID, params=params, why_params=why, changes_numerics=True, needs_consent=True
    )
    return Arm(name, "alone", [fix])


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
        flag = find_batch_flag(base["command"]) if config.get("batch_flag") else None
        self.flag: BatchFlag | None = flag
        self.base = base  # (TrialLoop sets it too) the arms' commands are made from it
        arms = [self._arm(f) for f in self.factors]
        super().__init__(store, experiment_id, base, config, progress, arms)

    def _arm(self, factor: int) -> Arm:
        if factor == 1:
            return Arm("x1", "baseline", [])
        if self.flag is not None:
            return self._size_arm(f"x{factor}", self.flag.value * factor)
        return _fix_arm(f"x{factor}", {"factor": factor}, f"batch size x{factor} (the sweep)")

    def _size_arm(self, name: str, size: int) -> Arm:
        """An arm at batch ``size``: the command's flag, or the DataLoader's batch size."""
        if self.flag is not None:
            return Arm(
                name, "alone", [], command=self.flag.command_with(self.base["command"], size)
            )
        return _fix_arm(name, {"batch_size": size}, f"batch size {size} (the sweep)")

    def run(self) -> dict[str, Any]:
        self._rounds("sweep")
        plain = self.arms[: len(self.factors)]  # the job as it is (memory curves follow)
        rows = [self._row(f, a) for f, a in zip(self.factors, plain, strict=True)]
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
        if arm.command is not None and self.flag is not None:
            return [f"{self.flag.flag} {arm.command[self.flag.index].rpartition('=')[2]}"]
        return [f"{f.id}({', '.join(f'{k}={v}' for k, v in f.params.items())})" for f in arm.fixes]

    def _row(self, factor: float, arm: Arm) -> dict[str, Any]:
        row: dict[str, Any] = {
            "factor": factor,
            "arm": arm.name,
            "runs": list(arm.runs),
            "status": "completed",
            "error": arm.error,
            "failure": arm.failure,
            "batch_size": None,
            "applied": applied_batch(self.store, arm.runs),
        }
        if arm.failed:
            row["status"] = "not applied" if arm.not_applied and not arm.error else "failed"
            row["error"] = arm.error or "; ".join(x["why"] for x in arm.not_applied)
            return row
        row.update(arm_figures(self.store, arm.runs, self._asked(arm)))
        return row

    def _asked(self, arm: Arm) -> int | None:
        """The batch size an arm asked for: its command's flag, else its fix's size (or
        factor) over the recorded DataLoader's; None where neither is known. Steps that
        record no batch size of their own are counted at it (``arm_figures``)."""
        if self.flag is not None:
            command = arm.command or self.base["command"]
            return int(command[self.flag.index].rpartition("=")[2])
        loaders = (self.base.get("facts") or {}).get("dataloaders") or []
        recorded = next((ld["batch_size"] for ld in loaders if ld.get("batch_size")), None)
        params = arm.fixes[0].params if arm.fixes else {}
        if params.get("batch_size"):
            return int(params["batch_size"])
        return int(recorded * (params.get("factor") or 1)) if recorded else None


class _TrainingSweep(_Sweep):
    """A training job's sweep: each row's peak memory, and after the rounds the largest
    batch that fits, predicted from the peaks and confirmed by runs (``largest_batch``);
    with memory fixes (``config["memory_fixes"]``), the same again for each fix: its
    arms run in the same rounds, and its curve gets its own confirming runs."""

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        base: dict[str, Any],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        super().__init__(store, experiment_id, base, config, progress)
        self.curves: list[list[str]] = [[fix_id] for fix_id in config.get("memory_fixes") or []]
        for extra in self.curves:
            self.arms += [with_fixes(self._arm(f), extra) for f in self.factors]
        self.total = len(self.arms) * config["trials"]

    def run(self) -> dict[str, Any]:
        result = super().run()
        n = len(self.factors)
        curve_arms = [self.arms[(i + 1) * n : (i + 2) * n] for i in range(len(self.curves))]
        basis = memory_basis(self.base, self.config.get(MEMORY_LIMIT_KEY))
        result["rows"], result["largest_batch"] = self._curve(
            result["rows"], self.arms[:n], [], basis
        )
        result["curves"] = []
        for extra, arms in zip(self.curves, curve_arms, strict=True):
            rows = [self._row(f, a) for f, a in zip(self.factors, arms, strict=True)]
            rows, largest = self._curve(rows, arms, extra, basis)
            result["curves"].append({"fixes": extra, "rows": rows, "largest_batch": largest})
        result["numerics"] = (
            "a training job learns differently at another batch (scale the learning rate "
            "with it); the sweep only measures: nothing of the job is changed"
        )
        return result

    def _curve(
        self, rows: list[dict[str, Any]], arms: list[Arm], extra: list[str], basis: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One curve's rows with their peaks and confirming runs, and its largest batch."""
        for row, arm in zip(rows, arms, strict=True):
            self._add_size_and_peak(row, arm, basis["key"])
        first_fit = fit_peak(self._points(rows))
        self._confirm(rows, first_fit, basis, extra)
        rows.sort(key=lambda r: (r.get("batch_size") or 0, r["factor"]))
        return rows, answer(rows, basis, first_fit, fit_peak(self._points(rows)))

    def _add_size_and_peak(self, row: dict[str, Any], arm: Arm, key: str) -> None:
        if row.get("batch_size") is None:
            row["batch_size"] = row.get("applied") or self._asked(arm)
        peaks = [trial_peak(self.store.run(r), key) for r in arm.runs]
        peaks = [p for p in peaks if p is not None]
        row["peak_bytes"] = float(np.median(peaks)) if peaks and not arm.failed else None
        row["peak_key"] = key

    def _points(self, rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
        return [
            (int(r["batch_size"]), float(r["peak_bytes"]))
            for r in rows
            if r.get("status") == "completed" and r.get("batch_size") and r.get("peak_bytes")
        ]

    def _confirm(
        self,
        rows: list[dict[str, Any]],
        fit: dict[str, float] | None,
        basis: dict[str, Any],
        extra: list[str],
    ) -> None:
        """Runs at the predicted largest batch (then halfway, where it runs out), each
        added to ``rows``: the answer is always a batch that ran."""
        limit = basis["limit_bytes"]
        if limit is None:
            return
        base_size = next((r["batch_size"] for r in rows if r["factor"] == 1), None)
        for _ in range(MAX_CONFIRMS):
            fits = [r["batch_size"] for r in rows if r.get("status") == "completed"]
            if not fits or not all(fits):
                return
            # a miss below a batch that ran (an uneven peak, ``answer``'s note) bounds nothing
            misses = [
                r["batch_size"]
                for r in rows
                if r.get("failure") == "oom" and (r.get("batch_size") or 0) > max(fits)
            ]
            size = next_size(predict(fit, limit), max(fits), min(misses) if misses else None)
            if size is None or (self.flag is None and not base_size):
                return
            arm = with_fixes(self._size_arm(f"batch {size}", size), extra)
            self.arms.append(arm)
            self.total += 1
            self._trial(arm, 0, "largest_batch")
            factor = round(size / base_size, 3) if base_size else size
            row = self._row(factor, arm)
            self._add_size_and_peak(row, arm, basis["key"])
            row["batch_size"] = row["batch_size"] or size
            row["confirm"] = True
            rows.append(row)
            if row.get("status") == "completed" and row.get("peak_bytes"):
                fit = fit_peak(self._points(rows)) or fit


__all__ = [
    "DEFAULT_FACTORS",
    "SWEEP_KIND",
    "SWEEPS",
    "check_sweepable",
    "parse_factors",
    "run_sweep",
]
