"""The arms of an experiment, their order, and launching one trial run of an arm.

An *arm* is one configuration of the job: the baseline, or a candidate set of fixes.
Trial k runs every arm once, in the arm order rotated by k (A B C, B C A, C A B, ...):
machine drift (a neighbour's burst, thermal state) then hits every arm, and no arm
always runs first or after the same arm. A fixed order biased our paired overhead
measurements (bench/overhead.py).

A trial is an ordinary run of the baseline's recorded command (same cwd, same
arguments, same recorded environment), bounded to the experiment's steps, with the
arm's plan file and the variables of the fixes applied through the environment.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from stepscope.collectors.launch.launcher import launch_run
from stepscope.collectors.launch.memory_limit import MEMORY_LIMIT_KEY
from stepscope.optim_runner.trials import plan as planning
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.store.artifacts import upload_run_file
from stepscope.store.signing import replayed_env, signature_refusal

OUTPUT_LOG = "output.log"


class ReplayRefused(ValueError):
    """The baseline's row is not one this user's stepscope recorded as it stands (its
    signature, ``store/signing.py``): nothing of it is run. One line naming the field."""


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
    plan: dict[str, Any] = field(default_factory=dict)  # more for its plan file (a sweep's)
    stopped: str | None = None  # why an adaptive experiment stopped giving it trials
    # a training batch sweep's arm: the baseline's command with another batch-size value
    # (``sweeps/batch_flag.py``), built here from the checked command, never read back
    command: list[str] | None = None

    @property
    def fix_ids(self) -> list[str]:
        return [f.id for f in self.fixes]

    @property
    def failed(self) -> bool:
        """Not run again: it failed, or its fixes did not take effect."""
        return self.error is not None or bool(self.not_applied)

    @property
    def runnable(self) -> bool:
        """Gets the next round's trial: not failed, not stopped (``adaptive.py``)."""
        return not self.failed and self.stopped is None


# -- arms and their order ----------------------------------------------------------------
def candidate_arms(planned: list[PlannedFix], full: bool = True) -> list[Arm]:
    """All fixes together, then each fix alone (with the fix it needs), without repeats.

    Unless ``full`` (``--full``, or fixes the user named), a fix predicted to gain nothing
    alone (``PlannedFix.gains_nothing``) gets no arm of its own: a trial cannot pay for
    itself there, and what it earns beside the others is measured by leave-one-out from
    the fastest set."""
    arms = [Arm("all", "all", list(planned))]
    if len(planned) > 1:
        by_id = {f.id: f for f in planned}
        for fix in planned:
            if fix.gains_nothing and not full:
                continue
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


# -- one trial run -----------------------------------------------------------------------
def launch_trial(
    store: Any,
    experiment_id: int,
    base: dict[str, Any],
    arm: Arm,
    k: int,
    phase: str,
    config: dict[str, Any],
    timeout_s: float,
    stall_s: float | None = None,
) -> int:
    """Run trial ``k`` of ``arm`` to its end; returns the trial's run id.

    The run is linked to the baseline run ``base`` (``parent_run_id``) and says in its
    ``config`` which experiment, arm, trial and phase it belongs to.
    """
    check_replayable(base)  # the callers asked already; this is the last gate
    env = replayed_env(base)  # the signed allow-list only: never the row's other variables
    env.update(planning.plan_env(arm.fixes, env))
    run_id, _exit_code = launch_run(
        arm.command or base["command"],
        name=f"{base['name']} [{arm.name} #{k + 1}]",
        max_steps=config["steps"],
        home=store.home,
        extra_env=env,
        parent_run_id=base["id"],
        config={
            "experiment": experiment_id,
            "arm": arm.name,
            "fixes": arm.fix_ids,
            "trial": k,
            "phase": phase,
        },
        cwd=base["cwd"],
        output_path=OUTPUT_LOG,
        timeout_s=timeout_s,
        stall_s=stall_s,
        quiet=True,
        # the baseline's memory cap holds for every trial: a fix is judged under it (a
        # batch sweep may set its own: the limit its largest batch must fit under)
        memory_limit=config.get(MEMORY_LIMIT_KEY)
        or (base.get("config") or {}).get(MEMORY_LIMIT_KEY),
        plan={
            **planning.plan_document(
                arm.fixes,
                seed=config["seed"],
                override_explicit=not config.get("keep_explicit", False),
                record_outputs=config.get("record_outputs"),
            ),
            **arm.plan,
        },
    )
    upload_run_file(store, run_id, OUTPUT_LOG, "log")  # to STEPSCOPE_ARTIFACTS, if set
    return run_id


def check_replayable(base: dict[str, Any]) -> None:
    """Raise ReplayRefused (one line naming the run) unless ``base`` may be re-run here."""
    refused = replay_refusal(base)
    if refused is not None:
        raise ReplayRefused(f"run {base.get('id')}: {refused}")


def replay_refusal(base: dict[str, Any]) -> str | None:
    """Why ``base``'s recorded command must not be run here; None when it may: this
    host's own run (a pid or a path recorded elsewhere means nothing here), signed by
    this user's key over the command, folder, variables, user and host it replays."""
    if base.get("host") != socket.gethostname():
        return f"recorded on {base.get('host')}, not on this host"
    return signature_refusal(base)


__all__ = [
    "OUTPUT_LOG",
    "Arm",
    "ReplayRefused",
    "candidate_arms",
    "check_replayable",
    "launch_trial",
    "replay_refusal",
    "rotated",
]
