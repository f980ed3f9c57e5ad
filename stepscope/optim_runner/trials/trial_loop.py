"""The loop every kind of experiment shares: interleaved trials of its arms, in the store.

An experiment (fixes against a baseline, ``experiment.py``) and a batch-size sweep
(``sweep.py``) differ in their arms and in what they make of the trials. How a trial is
launched, how a failing one is recorded, how progress reaches the store (where the
dashboard follows it), and how the experiment's row ends are the same, and live here:

* **Rounds.** Each round runs every arm still standing once, in an order rotated by the
  round (A B C, B C A, ...), so machine drift and warm caches hit every arm alike.
* **The first arm is the reference.** When it fails, nothing is left to compare with
  and the experiment ends; any other arm that fails is dropped (``failures.py``) and its
  remaining trials leave the total, so the progress bar stays honest.
* **Between rounds** an experiment may stop arms or end (``_between_rounds``: the
  adaptive design, ``design.py``), and before a trial it may stop the arm
  (``_before_trial``); a stopped arm's remaining trials, and the rounds not run, leave
  the total as a failed arm's do.
* **A busy trial is run again** where the experiment repeats them (``repeats.py``): its
  run stays in the store, out of its arm's runs, and the total grows by one.
* **The row tells the truth.** ``run_recorded`` marks the experiment completed with its
  result, or failed with one line and what is known so far, whatever ends it.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import psutil

from stepscope.optim_runner.trials.failures import Timeouts, drop_if_failed, trial_error
from stepscope.optim_runner.trials.repeats import Repeats
from stepscope.optim_runner.trials.trials import (
    Arm,
    ReplayRefused,
    check_replayable,
    launch_trial,
    rotated,
)

Progress = Callable[[dict[str, Any]], None]


class ExperimentError(RuntimeError):
    """The experiment cannot go on (nothing to try, the baseline fails)."""


class ExperimentInterrupted(KeyboardInterrupt):
    """A trial was interrupted by the user (Ctrl-C, SIGTERM): the experiment stops."""


class TrialLoop(ABC):
    """The state of one experiment while its trials run; subclasses choose the arms
    (the first is the reference) and make the result (``run``)."""

    kind: str | None = None  # the experiment's kind in its result (None: fixes)
    reference_failed = "the baseline failed"

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        base: dict[str, Any],
        config: dict[str, Any],
        progress: Progress | None,
        arms: list[Arm],
    ) -> None:
        self.store = store
        self.id = experiment_id
        self.base = base
        self.config = config
        self.callback = progress
        self.arms = arms
        self.order: list[list[str]] = []
        self.done = 0
        self.total = len(arms) * config["trials"]
        self.timeouts = Timeouts(
            config["timeout_s"], store, base, config["steps"], config.get("stall_s")
        )
        self.rounds: dict[str, int] = {}  # phase -> rounds run
        self.trial_s: dict[str, list[float]] = {}  # arm name -> wall time of its trials
        self.repeats: Repeats | None = None  # busy trials run again (None: never)

    @abstractmethod
    def run(self) -> dict[str, Any]:
        """Run the trials and make the result (each kind of experiment its own)."""

    def _all_arms(self) -> list[Arm]:
        return list(self.arms)

    def _fix_labels(self, arm: Arm) -> list[str]:
        """How the progress names an arm's fixes."""
        return arm.fix_ids

    def _rounds(self, phase: str, arms: list[Arm] | None = None, record: bool = True) -> None:
        """Rounds of ``arms`` (default: the experiment's; the first is the reference),
        each arm still runnable once per round; ``record``: in ``arm_order``."""
        arms = self.arms if arms is None else arms
        trials = self.config["trials"]
        for k in range(trials):
            if k and not self._next_round(phase, k, arms):
                break
            order = rotated([a for a in arms if a.runnable], k)
            ran = [a.name for a in order]
            if record:
                self.order.append(ran)
            for arm in order:
                why = self._before_trial(phase, arm, arms)
                if why is not None:  # it gets no trial: out of the round's order
                    ran.remove(arm.name)
                    self._stop(arm, why, k)
                    self._decided(phase, k, {arm.name: why}, None, [f"{arm.name}: {why}"])
                    continue
                self._trial(arm, k, phase)
            self.rounds[phase] = k + 1

    def _next_round(self, phase: str, k: int, arms: list[Arm]) -> bool:
        """Before round ``k``: whether it runs; what was decided goes to the progress,
        and the trials that will not run leave its total."""
        running = [a for a in arms if a.runnable]
        go_on = self._between_rounds(phase, k, arms)
        if not go_on:  # the rounds not run
            self.total -= (self.config["trials"] - k) * sum(1 for a in arms if a.runnable)
        stopped = [a for a in running if a.stopped]
        ended = None if go_on else self._why_ended(phase)
        if stopped or ended:
            lines = [f"{a.name}: {a.stopped}" for a in stopped]
            rounds = "confirmation rounds" if phase == "confirm" else "rounds"
            lines += [f"no more {rounds}: {ended}"] if ended else []
            self._decided(phase, k, {a.name: a.stopped for a in stopped}, ended, lines)
        return go_on

    def _why_ended(self, phase: str) -> str | None:
        """Why ``phase`` ended before its last round (``_between_rounds`` said so)."""
        return None

    def _between_rounds(self, phase: str, k: int, arms: list[Arm]) -> bool:
        """Before round ``k`` (>= 1): does it run? Every round runs unless a kind of
        experiment decides otherwise (``experiment.py``: the adaptive design)."""
        return True

    def _before_trial(self, phase: str, arm: Arm, arms: list[Arm]) -> str | None:
        """Why ``arm`` gets no trial now (it is stopped); None: it runs. Every arm runs
        unless a kind of experiment decides otherwise (``experiment.py``)."""
        return None

    def _stop(self, arm: Arm, why: str, k: int) -> None:
        """No more trials for ``arm`` from round ``k`` on: they leave the total."""
        arm.stopped = why
        self.total -= self.config["trials"] - k

    def _trial(self, arm: Arm, k: int, phase: str) -> None:
        """Trial ``k`` of ``arm``, run again while ``repeats`` says other work spoilt it."""
        while True:
            self._report("trial_start", arm, k, phase)
            started = time.monotonic()
            run_id = launch_trial(
                self.store,
                self.id,
                self.base,
                arm,
                k,
                phase,
                self.config,
                self.timeouts.current(arm.fix_ids),
                self.timeouts.stall(arm.fix_ids),
            )
            self.trial_s.setdefault(arm.name, []).append(time.monotonic() - started)
            arm.runs.append(run_id)
            run = self.store.run(run_id)
            self.done += 1
            if self._counted(arm, run, k, phase):
                return

    def _counted(self, arm: Arm, run: dict[str, Any], k: int, phase: str) -> bool:
        """Judge one trial's run: False when it is run again (busy); raises when the
        experiment cannot go on."""
        run_id = run["id"]
        if run["status"] == "interrupted":
            self._report("trial_end", arm, k, phase, run_id, run["status"])
            raise ExperimentInterrupted(f"trial run {run_id} was interrupted")
        if arm.kind == "baseline":
            error = trial_error(self.store, run)
            if error is not None:
                self._report("trial_end", arm, k, phase, run_id, "failed", error)
                raise ExperimentError(f"{self.reference_failed} (run {run_id}): {error}")
            self.timeouts.observe(run)
        else:
            error = drop_if_failed(self.store, arm, run)
            if error is not None:
                # not run again: the remaining trials of this arm drop out of the total
                self.total -= self.config["trials"] - 1 - k
        if error is None and self.repeats is not None:
            why = self.repeats.check(self.store, arm, run, k, phase)
            if why is not None:
                arm.runs.remove(run_id)  # kept in the store, out of the statistics
                self.total += 1
                self._report("trial_end", arm, k, phase, run_id, "repeated", note=why)
                return False
        status = "failed" if arm.error else ("not applied" if arm.not_applied else "ok")
        self._report("trial_end", arm, k, phase, run_id, status, error)
        return True

    def _report(
        self,
        event: str,
        arm: Arm,
        trial: int,
        phase: str,
        run_id: int | None = None,
        status: str | None = None,
        error: str | None = None,
        note: str | None = None,
    ) -> None:
        self._publish(
            event,
            trial,
            phase,
            arm=arm.name,
            fixes=self._fix_labels(arm),
            run_id=run_id,
            status=status,
            error=error,
            note=note,
        )

    def _decided(
        self,
        phase: str,
        k: int,
        stopped: dict[str, str | None],
        ended: str | None,
        lines: list[str],
    ) -> None:
        """The progress after a decision between rounds: its new total, and why."""
        self._publish(
            "decision", k, phase, note="; ".join(lines), lines=lines, stopped=stopped, ended=ended
        )

    def _publish(self, event: str, trial: int, phase: str, **fields: Any) -> None:
        """One progress record: to the store (where the dashboard follows it) and the
        caller's callback. Fields not given are None (``fixes``: none)."""
        state = {
            "event": event,
            "done": self.done,
            "total": self.total,
            "arm": None,
            "fixes": [],
            "trial": trial,
            "trials": self.config["trials"],
            "phase": phase,
            "run_id": None,
            "status": None,
            "error": None,
            "note": None,
            **fields,
            "runs": {a.name: list(a.runs) for a in self._all_arms()},
            "t": time.time(),
        }
        self.store.update_experiment(self.id, progress=state)
        if self.callback is not None:
            self.callback(state)

    def partial_result(self) -> dict[str, Any]:
        """What is known when the experiment stops early: the runs of each arm."""
        out: dict[str, Any] = {"kind": self.kind} if self.kind else {}
        out.update(
            experiment_id=self.id,
            baseline_run=self.base["id"],
            arm_order=self.order,
            runs={a.name: list(a.runs) for a in self._all_arms()},
            errors={a.name: a.error for a in self._all_arms() if a.failed},
            stopped={a.name: a.stopped for a in self._all_arms() if a.stopped},
        )
        if self.repeats is not None:
            out["repeated"] = self.repeats.to_json()
        return out


def run_recorded(
    store: Any,
    baseline_run_id: int,
    config: dict[str, Any],
    experiment_id: int | None,
    make: Callable[[int], TrialLoop],
) -> dict[str, Any]:
    """Run ``make(experiment id)`` in this process as the experiment's row says: created
    here (or the row made beforehand by ``background``, taken over with this pid), then
    completed with the result, or failed with one line and the partial result."""
    pid, started = os.getpid(), process_started_at(os.getpid())
    try:
        check_replayable(store.run(baseline_run_id))  # before a row or a trial exists
    except ReplayRefused as exc:
        if experiment_id is not None:
            store.update_experiment(
                experiment_id, status="failed", error=str(exc), ended_at=time.time()
            )
        raise
    if experiment_id is None:
        experiment_id = store.create_experiment(
            baseline_run_id, config, pid=pid, pid_started_at=started
        )
    else:
        store.update_experiment(
            experiment_id, config=config, pid=pid, pid_started_at=started, status="running"
        )
    loop = make(experiment_id)
    try:
        result = loop.run()
    except BaseException as exc:
        error = "interrupted" if isinstance(exc, KeyboardInterrupt) else one_line(exc)
        store.update_experiment(
            experiment_id,
            status="failed",
            error=error,
            ended_at=time.time(),
            result=loop.partial_result(),
        )
        raise
    store.update_experiment(experiment_id, status="completed", ended_at=time.time(), result=result)
    return result


def process_started_at(pid: int) -> float | None:
    """A process's create time, stored beside its pid so that the store can tell the
    experiment's process from a later one that reuses the pid; None when unknown."""
    try:
        return psutil.Process(pid).create_time()
    except Exception:
        return None


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
