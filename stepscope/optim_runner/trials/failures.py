"""How a trial can fail, and the time it is given before it counts as hung.

* **A failing candidate costs only itself.** A crash, an out-of-memory error or a hang
  (no end within the timeout: by default 5x the baseline trial, at least 60 s) is
  recorded on its arm with its error, and the arm is not run again; the others go on.
* **Applied, verified, or not measured.** After a candidate's trial the job's own
  report (``config.applied``) says whether each fix took effect on the real objects
  (``fixes.took_effect``); one that did not is "not applied" with the reason, is not
  run again, and gets no speed-up, verdict or "slower".
* **A trial that stops stepping is a hang at once.** Once it has recorded a step, a
  trial that records none for its stall limit (by default 10x the longest wait between
  two steps of the baseline, at least 60 s) is ended as hung, long before its timeout.
* **Slow starts are not hangs.** A fix that compiles at its first steps
  (``Fix.slow_start``: torch.compile) gets minutes more: compiling a model on a small
  CPU is a one-off cost.

A failing *baseline* is the runner's to handle (``experiment.py``): it ends the
experiment, since there is nothing left to compare with; except a baseline that ran out
of memory (``ran_out_of_memory``), whose experiment asks which arms fit instead.
"""

from __future__ import annotations

from typing import Any

from stepscope import fixes as catalog
from stepscope.errors import is_out_of_memory
from stepscope.fixes.took_effect import not_applied
from stepscope.optim_runner.speedup.stats import timed_step_times
from stepscope.optim_runner.trials.trials import Arm

MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 5.0
FALLBACK_TIMEOUT_S = 600.0  # the baseline's length is unknown (it never recorded a step)
SLOW_START_ALLOWANCE_S = 300.0
MIN_AUTO_STALL_S = 60.0
STALL_FACTOR = 10.0


def trial_error(store: Any, run: dict[str, Any]) -> str | None:
    """Why a trial run cannot be used; None when it ran its steps."""
    if run["status"] in ("completed", "stopped"):
        if run.get("stop_reason") == "sweep":
            # a generation sweep's trial: its batches are all timed (it warms up apart)
            requests = store.requests(run["id"])
            if requests.empty or not (requests["status"] == "done").any():
                return "no request finished (the sweep's batches)"
            return None
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
    if "timed out" in text or "(hang?)" in text:
        return "hang"
    if is_out_of_memory(text):  # CUDA's OutOfMemoryError, the CPU allocator's message
        return "oom"
    return "crash"


def ran_out_of_memory(run: dict[str, Any]) -> bool:
    """The run's job died of an out-of-memory error: its ``oom`` record
    (``collectors/injob/oom_record.py``) or an error line that says so."""
    if (run.get("config") or {}).get("oom"):
        return True
    return run.get("status") not in ("completed", "stopped") and (
        failure_kind(run.get("error") or "") == "oom"
    )


def not_applied_error(items: list[dict[str, str]]) -> str:
    """The one-line error of a candidate whose fixes did not take effect."""
    return "not applied: " + "; ".join(f"{x['fix']}: {x['why']}" for x in items)


def drop_if_failed(store: Any, arm: Arm, run: dict[str, Any]) -> str | None:
    """After a candidate's trial ``run``: record on ``arm`` why it is not run again (it
    failed, or a fix did not take effect) and return that error; None when it goes on."""
    error = trial_error(store, run)
    if error is not None:
        arm.error, arm.failure, arm.failed_run = error, failure_kind(error), run["id"]
        return error
    arm.not_applied = not_applied(arm.fix_ids, run.get("config"))
    if arm.not_applied:
        return not_applied_error(arm.not_applied)
    return None


def slow_starting(fix_ids: list[str]) -> list[str]:
    """The fixes among ``fix_ids`` that compile at their first steps (``Fix.slow_start``):
    their trials get ``SLOW_START_ALLOWANCE_S`` more, and the Optimize page warns that
    they can add minutes per trial."""
    return [fix_id for fix_id in fix_ids if catalog.get(fix_id).slow_start]


class Timeouts:
    """Per-trial timeout: the user's, or 5x the longest baseline trial (at least 60 s);
    and per-trial stall limit: the user's, or 10x the longest wait between two steps of
    the baseline (its recorded run and its trials; at least 60 s).

    Before the first baseline trial has run, the recorded baseline run stands in:
    its start-up plus ``steps`` of its median step time. An arm that compiles gets
    minutes more of both: compiling a model on a small CPU is a one-off cost (and a
    recompile can come after the first step), not a hang.
    """

    def __init__(
        self,
        explicit: float | None,
        store: Any,
        baseline_run: dict[str, Any],
        steps: int,
        explicit_stall: float | None = None,
    ) -> None:
        self.explicit = explicit
        self.explicit_stall = explicit_stall
        self.store = store
        self.longest: float | None = None
        recorded = store.steps(baseline_run["id"])  # read once for both figures
        self.estimate = _estimate_trial_s(baseline_run, recorded, steps)
        self.gap = _longest_gap_s(recorded)

    def observe(self, run: dict[str, Any]) -> None:
        if run.get("ended_at") and run.get("started_at"):
            wall = float(run["ended_at"]) - float(run["started_at"])
            self.longest = max(self.longest or 0.0, wall)
        gap = _longest_gap_s(self.store.steps(run["id"]))
        if gap is not None:
            self.gap = max(self.gap or 0.0, gap)

    def stall(self, fixes: list[str]) -> float:
        if self.explicit_stall is not None:
            return float(self.explicit_stall)
        value = max(MIN_AUTO_STALL_S, STALL_FACTOR * (self.gap or 0.0))
        if slow_starting(fixes):
            value += SLOW_START_ALLOWANCE_S
        return round(value, 1)

    def current(self, fixes: list[str]) -> float:
        if self.explicit is not None:
            value = float(self.explicit)
        else:
            reference = self.longest if self.longest is not None else self.estimate
            if reference is None:
                value = FALLBACK_TIMEOUT_S
            else:
                value = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * reference)
            if slow_starting(fixes):
                value += SLOW_START_ALLOWANCE_S
        return round(value, 1)


def _longest_gap_s(steps: Any) -> float | None:
    """The longest time between the ends of two consecutive steps of one process (rank
    and worker): what a healthy run of the job has already waited without a new step."""
    if steps is None or len(steps) < 2:
        return None
    ends = steps.sort_values("end_s").groupby(["rank", "worker"])["end_s"].diff()
    return None if ends.isna().all() else float(ends.max())


def _estimate_trial_s(run: dict[str, Any], recorded: Any, steps: int) -> float | None:
    """Seconds a trial of ``steps`` steps should take, from the recorded run and its steps."""
    started, ended = run.get("started_at"), run.get("ended_at")
    if started and not recorded.empty:
        startup = max(0.0, float(recorded["start_s"].min()) - float(started))
        median = float((recorded["end_s"] - recorded["start_s"]).median())
        return startup + steps * median
    if started and ended:
        return float(ended) - float(started)
    return None


__all__ = [
    "SLOW_START_ALLOWANCE_S",
    "Timeouts",
    "drop_if_failed",
    "failure_kind",
    "not_applied_error",
    "ran_out_of_memory",
    "slow_starting",
    "trial_error",
]
