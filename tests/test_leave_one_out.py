"""Leave-one-out from the fastest set: which fixes earn its gain, and what each earns.

The rules (``optim_runner/verdict/leave_one_out.py``) over synthetic figures, then real
experiments on tests/jobs/plan_effects.py: ``fused_optimizer`` halves the step's wait,
``cudnn_benchmark`` halves it again only beside it (alone it changes nothing), and
``channels_last`` applies for real but changes nothing. The sleeps are far longer than
the job's work, as test_experiment's are, so the verdicts rest on them.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import fixes_page, verdict_page

from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.experiment.experiment import ExperimentOptions, run_experiment
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trials import Arm
from stepscope.optim_runner.verdict.leave_one_out import (
    Removal,
    alone_removal,
    cheapest,
    fastest_set,
    in_set_text,
    keep_set,
    loo_best,
    loo_text,
    removal_from,
    to_drop,
    units,
    without,
)
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def _o(name: str, fixes: list[str], speedup: float, verdict: str = "faster", **kw: Any) -> dict:
    out = {"name": name, "fixes": fixes, "speedup": speedup, "ci": [speedup * 0.9, speedup * 1.1]}
    return {**out, "status": "completed", "verdict": verdict, "quality_ok": True, **kw}


# -- the rules ---------------------------------------------------------------------------
def test_a_fix_leaves_the_set_with_the_fixes_that_need_it() -> None:
    plan = [
        PlannedFix("dataloader_workers"),
        PlannedFix("persistent_workers", needs="dataloader_workers"),
        PlannedFix("torch_compile"),
    ]
    parts = units(plan)
    assert parts["dataloader_workers"] == ("dataloader_workers", "persistent_workers")
    assert parts["persistent_workers"] == ("persistent_workers",)
    assert [f.id for f in without(plan, parts["dataloader_workers"])] == ["torch_compile"]


def test_a_fix_is_needed_only_when_the_set_is_clearly_slower_without_it() -> None:
    costs = Removal("torch_compile", ("torch_compile",), "all - torch_compile", 0.8, 0.75, 0.85)
    nothing = Removal("channels_last", ("channels_last",), "all - channels_last", 1.01, 0.97, 1.05)
    better = Removal("fused_optimizer", ("fused_optimizer",), "all - f", 1.1, 1.05, 1.15)
    assert costs.needed and not nothing.needed and not better.needed
    assert costs.text() == "removing it costs 1.25x (1.18-1.33)"
    assert nothing.text().startswith("removing it changed nothing measurable: 0.99x (0.95-1.03)")
    assert better.text().startswith("removing it made the set faster: 0.91x")
    assert to_drop([costs, nothing, better]) == [nothing, better]
    assert cheapest([nothing, better]) is better  # the set gained most without it
    assert costs.share() == {"ratio": 1.25, "ci": [1.1765, 1.3333]}
    unit = ("dataloader_workers", "persistent_workers")
    workers = Removal("dataloader_workers", unit, "all - dataloader_workers", 0.25, 0.2, 0.3)
    assert workers.text().startswith(
        "removing it (with persistent_workers, which need it) costs 4.00x"
    )


def test_a_removal_that_fails_or_breaks_the_guard_counts_as_needed() -> None:
    crashed = {"status": "failed", "failure": "crash", "error": "RuntimeError: boom", "ci": None}
    r = removal_from("dataloader_workers", ("dataloader_workers",), "all - w", crashed)
    assert r.needed and r.text() == "needed: without it the job failed (crash): RuntimeError: boom"
    broken = {**_o("x", [], 1.0), "quality_ok": False, "quality": {"reason": "loss diverged"}}
    r = removal_from("tf32", ("tf32",), "all - tf32", broken)
    assert r.needed and r.text() == "needed: without it the job broke its guard: loss diverged"
    unmeasured = removal_from("tf32", ("tf32",), "all - tf32", {"status": "completed"})
    assert unmeasured.needed and unmeasured.share() is None


def test_a_set_of_one_fix_reads_its_share_from_the_baseline() -> None:
    r = alone_removal("dataloader_workers", ("dataloader_workers",), _o("w", ["w"], 4.0))
    assert r.needed and r.arm is None
    assert r.share() == {"ratio": 4.0, "ci": [3.6, 4.4]}
    assert r.text() == "it alone gives 4.00x (3.60-4.40) over the baseline"


def test_leave_one_out_starts_from_the_fastest_arm_when_it_holds_several_fixes() -> None:
    workers = _o("dataloader_workers", ["dataloader_workers"], 3.7)
    compile_ = _o("torch_compile", ["torch_compile"], 0.87, "slower")
    all_ = _o("all", ["dataloader_workers", "torch_compile"], 4.36)
    diverged = _o("all2", ["dataloader_workers", "tf32"], 9.0, quality_ok=False)
    assert fastest_set([workers, compile_, all_, diverged]) is all_
    assert fastest_set([workers, {**all_, "speedup": 3.0}]) is None  # a single fix wins
    assert fastest_set([compile_]) is None


def _record() -> dict[str, Any]:
    needed = Removal("dataloader_workers", ("dataloader_workers",), None, 0.25, 0.2, 0.3)
    compile_ = Removal("torch_compile", ("torch_compile",), "all - torch_compile", 0.8, 0.7, 0.9)
    nothing = Removal("channels_last", ("channels_last",), "all - channels_last", 1.0, 0.9, 1.1)
    step1 = {
        "set": "all",
        "removals": [r.to_json() for r in (needed, compile_, nothing)],
        "dropped": ["channels_last"],
    }
    return {
        "from": "all",
        "from_speedup": 4.36,
        "from_ci": [4.1, 4.66],
        "set": "all - channels_last",
        "fixes": ["dataloader_workers", "torch_compile"],
        "outcome": _o("all - channels_last", ["dataloader_workers", "torch_compile"], 4.4),
        "shares": {"dataloader_workers": needed.to_json(), "torch_compile": compile_.to_json()},
        "dropped": {"channels_last": {**nothing.to_json(), "from": "all"}},
        "steps": [step1],
        "unsettled": None,
    }


def test_the_answer_and_the_per_fix_rows_tell_one_story() -> None:
    record = _record()
    best = loo_best(record)
    assert best["fixes"] == ["dataloader_workers", "torch_compile"] and best["speedup"] == 4.4
    assert loo_text(best) == (
        "leave-one-out from all (4.36x, 4.10-4.66): channels_last dropped "
        "(removing each changed nothing measurable)"
    )
    per_fix = {
        "dataloader_workers": {"id": "dataloader_workers", "kept": True, "measured": 3.7,
                               "verdict": "faster", "against": "baseline"},
        "torch_compile": {"id": "torch_compile", "kept": False, "measured": 0.87,
                          "verdict": "slower", "against": "baseline"},
        "channels_last": {"id": "channels_last", "kept": False, "measured": 0.92,
                          "verdict": "slower", "against": "baseline"},
    }  # fmt: skip
    keep_set(per_fix, record)
    compile_ = per_fix["torch_compile"]
    assert compile_["kept"] and in_set_text(compile_) == "1.25x (1.11-1.43)"
    assert compile_["loo_note"] == (
        "0.87x alone (slower); in the kept set, removing it costs 1.25x (1.11-1.43)"
    )
    assert compile_["in_set"]["against"] == "all - channels_last without it"
    dropped = per_fix["channels_last"]
    assert not dropped["kept"] and in_set_text(dropped) == "dropped"
    assert dropped["loo_note"].startswith("dropped from all: removing it changed nothing")
    assert in_set_text({"id": "x", "kept": False}) == "-"


def test_the_optimize_page_shows_each_fixs_share_and_each_step() -> None:
    from streamlit.testing.v1 import AppTest

    record = _record()
    fixes = []
    for fix_id, measured, verdict in (
        ("dataloader_workers", 3.7, "faster"),
        ("torch_compile", 0.87, "slower"),
        ("channels_last", 0.92, "slower"),
    ):
        fixes.append({"id": fix_id, "params": {}, "predicted": None, "measured": measured,
                      "ci": [measured * 0.95, measured * 1.05], "verdict": verdict,
                      "against": "baseline", "kept": False, "note": None})  # fmt: skip
    by_id = {f["id"]: f for f in fixes}
    keep_set(by_id, record)
    at = AppTest.from_function(fixes_page, args=({"fixes": fixes, "leave_one_out": record},))
    at.run()
    assert not at.exception
    per_fix = at.dataframe[0].value.set_index("fix")
    assert per_fix.loc["torch_compile", "in the kept set"] == "1.25x (1.11-1.43)"
    assert per_fix.loc["channels_last", "in the kept set"] == "dropped"
    assert per_fix.loc["torch_compile", "kept"] == "✓ keep"
    steps = at.dataframe[1].value.set_index("without")
    assert steps.loc["channels_last", "decision"].startswith("dropped: removing it changed")
    assert steps.loc["torch_compile", "decision"] == "kept: removing it costs 1.25x (1.11-1.43)"
    assert steps.loc["— (the baseline)", "decision"].startswith("kept: it alone gives 4.00x")


# -- real experiments --------------------------------------------------------------------
def _record_job(home: Path, *effects: str) -> int:
    command = [sys.executable, str(JOBS / "plan_effects.py"), "--steps", "40", "--wait", "0.05"]
    for effect in effects:
        command += ["--effect", effect]
    run_id, code = launch_run(command, home=home, max_steps=6, quiet=True)
    assert code == 0
    return run_id


@pytest.mark.slow
def test_the_fastest_set_loses_the_fix_that_does_nothing_and_keeps_the_ones_that_pay(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    run_id = _record_job(home, "fused_optimizer=fast", "cudnn_benchmark=stacked")
    seen: list[dict[str, Any]] = []
    with RunStore(home) as store:
        result = run_experiment(
            store,
            run_id,
            ExperimentOptions(
                fixes=("fused_optimizer", "cudnn_benchmark", "channels_last"), steps=16, trials=2
            ),
            progress=seen.append,
        )
    record = result["leave_one_out"]
    assert record["from"] == "all"  # a quarter of the wait: clearly the fastest
    shares = record["shares"]
    # without fused_optimizer the wait is 4x, without cudnn_benchmark 2x: both needed
    assert shares["fused_optimizer"]["needed"] and shares["fused_optimizer"]["share"]["ci"][0] > 1
    assert shares["cudnn_benchmark"]["needed"] and shares["cudnn_benchmark"]["share"]["ci"][0] > 1
    best = result["best"]
    assert {"fused_optimizer", "cudnn_benchmark"} <= set(best["fixes"])
    if "channels_last" in record["dropped"]:  # its removal changed nothing measurable
        assert best["fixes"] == ["fused_optimizer", "cudnn_benchmark"]
        assert best["candidate"] == "all - channels_last"
        assert record["steps"][0]["dropped"] == ["channels_last"]
    else:  # measured apart by chance on a loaded machine: then it is needed, with its share
        assert shares["channels_last"]["needed"]
    fixes = {f["id"]: f for f in result["fixes"]}
    assert (
        fixes["cudnn_benchmark"]["kept"]
        and "in the kept set, removing it costs" in (fixes["cudnn_benchmark"]["note"])
    )
    # the leave-one-out trials are counted in the progress, and end it at its total
    loo = [s for s in seen if s["phase"] == "leave_one_out" and s["event"] == "trial_end"]
    assert len(loo) == sum(len(s["removals"]) + 1 for s in record["steps"] if s["reference"])
    assert seen[-1]["done"] == seen[-1]["total"]
    # the answer says the same in the CLI and on the Optimize page
    buf = io.StringIO()
    render(result, console(file=buf))
    text = " ".join(buf.getvalue().split())
    assert f"Keep: {', '.join(best['fixes'])}" in text
    assert "leave-one-out from all (" in text and "Leave-one-out from all" in text
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(verdict_page, args=(result,)).run()
    assert not at.exception
    assert at.success[0].value.startswith(f"Keep **{', '.join(best['fixes'])}**")
    assert "leave-one-out from all (" in at.success[0].value


def test_a_fix_predicted_to_gain_nothing_runs_alone_only_under_full() -> None:
    from stepscope.optim_runner.trials.trials import candidate_arms

    plan = [
        PlannedFix("dataloader_workers", predicted_speedup=4.8),
        PlannedFix("torch_compile", predicted_speedup=1.004),  # shown as 1.00x
        PlannedFix("channels_last"),  # no bound: measured alone
    ]
    adaptive = [a.name for a in candidate_arms(plan, full=False)]
    assert adaptive == ["all", "dataloader_workers", "channels_last"]
    full = [a.name for a in candidate_arms(plan, full=True)]
    assert full == ["all", "dataloader_workers", "torch_compile", "channels_last"]


# -- the phase's steps, over arms whose speed is a function of their fixes ----------------
class _Runner:
    """What the phase asks of an experiment, with each arm's speed given by its fixes
    (the real trials are the slow test below): each round gives every arm one run."""

    def __init__(self, speed: Any, budget_rounds: int = 99) -> None:
        self.speed = speed
        self.budget_rounds = budget_rounds
        self.design = type("D", (), {"budget_min": 1.0, "budget_allows": self._budget})()
        self.trial_s: dict[str, list[float]] = {}
        self.total = 0
        self.config = {"trials": 1}
        self.arms = [Arm("baseline", "baseline", [])]
        self.rounds: list[list[str]] = []

    def baselines(self) -> list[Arm]:
        return self.arms[:1]

    def _budget(self, arms: list[str], trial_s: dict) -> bool:
        return len(self.rounds) < self.budget_rounds

    def _rounds(self, phase: str, arms: list[Arm], record: bool = False) -> None:
        assert phase == "leave_one_out" and not record
        self.rounds.append([a.name for a in arms])
        for a in arms:
            a.runs.append(len(self.rounds) * 100 + len(a.runs))

    def _evaluate(self, arm: Arm, against: Arm | None = None) -> dict[str, Any]:
        ratio = self.speed(set(arm.fix_ids)) / self.speed(
            set(against.fix_ids) if against else set()
        )
        return _o(arm.name, arm.fix_ids, ratio, ci=[ratio * 0.97, ratio * 1.03])


def _plan(*ids: str) -> list[PlannedFix]:
    return [PlannedFix(i) for i in ids]


def _phase(speed: Any, fixes: list[str], **kw: Any) -> tuple[_Runner, dict[str, Any]]:
    from stepscope.optim_runner.experiment.leave_one_out import LeaveOneOut

    runner = _Runner(speed, **kw)
    start = Arm("all", "all", _plan(*fixes), runs=[1])
    runner.arms.append(start)
    return runner, LeaveOneOut(runner).run(start, runner._evaluate(start))  # type: ignore[arg-type]


def test_fixes_that_change_nothing_leave_together_when_the_smaller_set_keeps_the_gain() -> None:
    def speed(fixes: set[str]) -> float:  # workers 4x; compile 1.2x once the workers feed it
        workers = 4.0 if "w" in fixes else 1.0
        return workers * (1.2 if {"w", "c"} <= fixes else 1.0)

    runner, record = _phase(speed, ["w", "c", "cl", "f"])
    assert record["fixes"] == ["w", "c"] and record["set"] == "all - cl - f"
    assert sorted(record["dropped"]) == ["cl", "f"]
    assert record["shares"]["c"]["share"]["ratio"] == pytest.approx(1.2, abs=1e-3)
    assert record["shares"]["w"]["share"]["ratio"] == pytest.approx(
        4.8, abs=1e-3
    )  # compile pays nothing without it
    # step 2 measured the smaller set beside the one it came from
    assert runner.rounds[1] == ["all - cl - f (again)", "all - cl - f - w", "all - cl - f - c",
                                "all (check)"]  # fmt: skip
    assert record["outcome"]["speedup"] == pytest.approx(4.8)
    assert runner.total == sum(len(r) for r in runner.rounds)


def test_two_fixes_that_stand_in_for_each_other_are_not_both_dropped() -> None:
    def speed(fixes: set[str]) -> float:  # a or b doubles it (either one suffices); c 1.5x
        return (2.0 if fixes & {"a", "b"} else 1.0) * (1.5 if "c" in fixes else 1.0)

    runner, record = _phase(speed, ["a", "b", "c"])
    assert len(record["fixes"]) == 2 and "c" in record["fixes"]
    assert len(record["dropped"]) == 1  # one of the two, never both
    assert "together lost gain" in record["steps"][1]["note"]
    assert all(r["needed"] for r in record["shares"].values())


def test_a_budget_that_runs_out_keeps_the_best_measured_set_and_says_so() -> None:
    runner, record = _phase(lambda fixes: 4.0 if "w" in fixes else 1.0, ["w", "c"], budget_rounds=0)
    assert record["fixes"] == ["w", "c"] and record["steps"] == [] and runner.rounds == []
    assert record["unsettled"].endswith("leave-one-out from all not run")
    assert "not settled: " in loo_text(loo_best(record))


def test_a_result_stored_before_leave_one_out_still_reads() -> None:
    from stepscope.optim_runner.verdict.stacked import over_text

    over = {"candidate": "dataloader_workers", "fixes": ["dataloader_workers"]}
    best = {"fixes": ["dataloader_workers", "torch_compile"], "candidate": "all"}
    best["over"] = {**over, "speedup": 1.86, "ci": [1.62, 2.13]}
    assert over_text(best) == "1.86x (1.62-2.13) over dataloader_workers"
    assert loo_text(best) is None
    assert over_text({"fixes": ["x"]}) is None and loo_text({"fixes": ["x"]}) is None
