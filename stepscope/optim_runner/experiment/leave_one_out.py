"""The leave-one-out phase: from the fastest set measured, take each fix out in turn
until every fix left is needed (the rules: ``verdict/leave_one_out.py``).

Each step is one phase of rounds (``TrialLoop._rounds``, phase ``leave_one_out``): the
set itself again, and the set without each of its fixes, interleaved, each judged
against the set's own trials of that step. In the adaptive design one round decides a
step (every arm is then needed, clearly slower without its fix, or not); ``--full``
runs every round. Its trials count in the progress total as they are planned, and no
step starts that the budget cannot hold: the best set measured so far is kept, and the
result says what was not settled.

Arms are named after the set they measure: ``all - torch_compile`` is the "all" arm
without torch_compile (and without the fixes that need it); the set's own trials of a
step are ``... (again)``, and the larger set a joint drop came from, measured once more
beside it, ``... (check)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepscope.optim_runner.experiment.adaptive import budget_text
from stepscope.optim_runner.trials.trials import Arm
from stepscope.optim_runner.verdict.leave_one_out import (
    Removal,
    alone_removal,
    cheapest,
    removal_from,
    to_drop,
    units,
    without,
)

if TYPE_CHECKING:  # the runner drives this phase; only its type is needed here
    from stepscope.optim_runner.experiment.experiment import _Runner

LEAVE_ONE_OUT = "leave_one_out"
KIND = "leave_one_out"
ONE_ROUND = "each arm is decided after one round: needed (clearly slower without it) or not"


@dataclass
class _Set:
    """A set of fixes on its way down, with the fixes taken out of the start to get it."""

    arm: Arm  # an arm that measured exactly this set (its runs), or one not run yet
    removed: list[str] = field(default_factory=list)

    def name(self, start: str) -> str:
        return " - ".join([start, *self.removed])

    @property
    def fixes(self) -> list[Any]:
        return list(self.arm.fixes)


@dataclass
class _JointDrop:
    """Several fixes dropped at once: the set they left (measured again beside the smaller
    one), and the set with only the cheapest dropped, for when the smaller one is slower."""

    bigger: _Set
    single: _Set
    fixes: list[str]


class LeaveOneOut:
    """The phase for one experiment: its arms, its steps, what it settled."""

    def __init__(self, runner: _Runner) -> None:
        self.runner = runner
        self.arms: list[Arm] = []  # every arm this phase ran, for the progress and the store
        self.steps: list[dict[str, Any]] = []
        self.unsettled: str | None = None

    def run(self, start: Arm, start_outcome: dict[str, Any]) -> dict[str, Any]:
        """From ``start`` (its outcome against the baseline), the smallest set that keeps
        its gain; returns the phase's record (``result["leave_one_out"]``)."""
        current = _Set(start)
        pending: _JointDrop | None = None  # a joint drop, checked against the set it left
        removals: list[Removal] = []
        while True:
            fixes = current.arm.fixes
            parts = units(fixes)
            name = current.name(start.name)
            ref = Arm(f"{name} (again)", KIND, list(fixes))
            loo = {
                fix: Arm(" - ".join([name, fix]), KIND, without(fixes, unit))
                for fix, unit in parts.items()
                if len(unit) < len(fixes)
            }
            check = None
            if pending is not None:
                check = Arm(
                    f"{pending.bigger.name(start.name)} (check)", KIND, pending.bigger.fixes
                )
            arms = [ref, *loo.values(), *([check] if check else [])]
            if len(arms) == 1:  # one fix (and what needs it): the baseline is the set without it
                removals = [self._alone(fix, parts[fix], current, start) for fix in parts]
                self.steps.append(_step(name, fixes, None, removals, [], None))
                break
            if not self.runner.design.budget_allows([a.name for a in arms], self.runner.trial_s):
                budget = budget_text(self.runner.design.budget_min or 0.0)
                self.unsettled = f"{budget}: leave-one-out from {name} not run"
                removals = []
                break
            self.runner.total += len(arms) * self.runner.config["trials"]
            self.arms.extend(arms)
            self.runner._rounds(LEAVE_ONE_OUT, arms, record=False)
            if ref.failed:
                self.unsettled = f"{ref.name} failed: {ref.error}"
                removals = []
                break
            if check is not None and pending is not None:
                back = self.runner._evaluate(check, against=ref)
                if back.get("status") == "completed" and (back.get("ci") or [0.0])[0] > 1.0:
                    note = (
                        f"{pending.bigger.name(start.name)} measured {back['speedup']:.2f}x "
                        f"over {name}: dropping {', '.join(pending.fixes)} together lost gain, "
                        f"so only {pending.single.removed[-1]} is dropped"
                    )
                    self.steps[-1]["dropped"] = [pending.single.removed[-1]]
                    self.steps.append(_step(name, fixes, ref, [], [], note))
                    current, pending = pending.single, None
                    continue
            removals = [
                removal_from(fix, parts[fix], arm.name, self.runner._evaluate(arm, against=ref))
                for fix, arm in loo.items()
            ] + [
                self._alone(fix, parts[fix], current, start)
                for fix in parts
                if fix not in loo  # removing it leaves nothing: the baseline
            ]
            drop = to_drop(removals)
            if drop and {f for r in drop for f in r.unit} >= {f.id for f in fixes}:
                drop = [cheapest(drop)]  # never down to nothing: the set beat the baseline
            self.steps.append(_step(name, fixes, ref, removals, drop, None))
            if not drop:
                break
            one = cheapest(drop)
            single = _Set(loo[one.fix], [*current.removed, one.fix])
            if len(drop) == 1:
                current, pending = single, None
                continue
            gone = [f for r in drop for f in r.unit]
            smaller = Arm("", KIND, without(fixes, gone))
            pending = _JointDrop(current, single, [r.fix for r in drop])
            current = _Set(smaller, [*current.removed, *pending.fixes])
        if pending is not None and not self._pooled(current, start).runs:
            current = pending.single  # a joint drop never measured: the last set that was
        return self._record(start, start_outcome, current, removals)

    # -- figures -----------------------------------------------------------------------
    def _alone(self, fix: str, unit: tuple[str, ...], current: _Set, start: Arm) -> Removal:
        outcome = self._against_baseline(self._pooled(current, start))
        return alone_removal(fix, unit, outcome)

    def _against_baseline(self, arm: Arm) -> dict[str, Any]:
        """``arm``'s figures against every baseline trial (the first round's and the
        confirmation's): its trials come from several phases too."""
        runs = [r for a in self.runner.baselines() for r in a.runs]
        return self.runner._evaluate(arm, against=Arm("baseline", "baseline", [], runs=runs))

    def _pooled(self, current: _Set, start: Arm) -> Arm:
        """Every trial of exactly ``current``'s fixes (the first round's arm, this phase's),
        as one arm: its figures against the baseline."""
        wanted = sorted(f.id for f in current.arm.fixes)
        runs = [
            r
            for a in [start, *self.runner.arms[1:], *self.arms]
            if sorted(a.fix_ids) == wanted and not a.failed
            for r in a.runs
        ]
        return Arm(
            current.name(start.name), KIND, list(current.arm.fixes), runs=list(dict.fromkeys(runs))
        )

    def _record(
        self, start: Arm, start_outcome: dict[str, Any], final: _Set, removals: list[Removal]
    ) -> dict[str, Any]:
        outcome = self._against_baseline(self._pooled(final, start))
        dropped: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            for r in step["removals"]:
                if r["fix"] in step["dropped"]:
                    for fix in r["removed"]:
                        dropped[fix] = {**r, "from": step["set"]}
        shares = {r.fix: r.to_json() for r in removals}
        return {
            "from": start.name,
            "from_fixes": start.fix_ids,
            "from_speedup": start_outcome.get("speedup"),
            "from_ci": start_outcome.get("ci"),
            "set": final.name(start.name),
            "fixes": [f.id for f in final.arm.fixes],
            "outcome": outcome,
            "shares": shares,
            "dropped": dropped,
            "steps": self.steps,
            "unsettled": self.unsettled,
            "arms": [a.name for a in self.arms],
        }


def _step(
    name: str,
    fixes: list[Any],
    ref: Arm | None,
    removals: list[Removal],
    drop: list[Removal],
    note: str | None,
) -> dict[str, Any]:
    return {
        "set": name,
        "fixes": [f.id for f in fixes],
        "reference": None if ref is None else ref.name,
        "removals": [r.to_json() for r in removals],
        "dropped": [r.fix for r in drop],
        "note": note,
    }
