"""Fixes that pay only once others are applied: a measured combination beats the kept ones.

The rule (``optim_runner/stacked.py``) over synthetic outcomes, then one real experiment
whose second fix halves the step's wait only beside the first (tests/jobs/plan_effects.py,
mode ``stacked``): alone it changes nothing, together they are twice the first alone.
The verdicts rest on sleeps far longer than the job's work, as test_experiment's do.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from dashboard_helpers import verdict_page

from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console
from stepscope.collectors.launcher import launch_run
from stepscope.optim_runner.experiment import run_experiment
from stepscope.optim_runner.stacked import keep_together, over_json, over_text, wider_best
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def _o(name: str, fixes: list[str], speedup: float, verdict: str = "faster", **kw: Any) -> dict:
    out = {"name": name, "fixes": fixes, "speedup": speedup, "ci": [speedup * 0.9, speedup * 1.1]}
    return {**out, "status": "completed", "verdict": verdict, "quality_ok": True, **kw}


WORKERS = _o("dataloader_workers", ["dataloader_workers"], 4.39)
COMPILE = _o("torch_compile", ["torch_compile"], 1.02, "no measurable change")
ALL = _o("all", ["dataloader_workers", "torch_compile"], 8.15)


def test_a_combination_clearly_faster_than_the_kept_fixes_is_the_best() -> None:
    asked: list[str] = []

    def against_top(o: dict) -> dict:
        asked.append(o["name"])
        return {"verdict": "faster", "speedup": 1.86, "ci": [1.62, 2.13]}

    found = wider_best([WORKERS, COMPILE, ALL], WORKERS, against_top)
    assert found is not None and found[0] is ALL and asked == ["all"]
    over = over_json(WORKERS, found[1])
    assert over == {
        "candidate": "dataloader_workers",
        "fixes": ["dataloader_workers"],
        "speedup": 1.86,
        "ci": [1.62, 2.13],
    }
    best = {"fixes": ALL["fixes"], "candidate": "all", "over": over}
    assert over_text(best) == "1.86x (1.62-2.13) over dataloader_workers"
    per_fix = {
        "dataloader_workers": {"kept": True, "note": None},
        "torch_compile": {
            "kept": False,
            "measured": 1.02,
            "verdict": "no measurable change",
            "note": None,
        },
    }
    keep_together(per_fix, best)
    assert per_fix["dataloader_workers"] == {"kept": True, "note": None}
    assert per_fix["torch_compile"]["kept"] is True
    assert per_fix["torch_compile"]["note"] == (
        "kept with all: alone 1.02x (no measurable change), but all measured 1.86x "
        "(1.62-2.13) over dataloader_workers; it pays once the others are applied (which "
        "of torch_compile earns it was not measured apart)"
    )


def test_no_combination_wins_without_being_clearly_faster_than_the_kept_fixes() -> None:
    same = {"verdict": "no measurable change", "speedup": 1.03, "ci": [0.9, 1.2]}
    assert wider_best([WORKERS, ALL], WORKERS, lambda o: same) is None
    # an arm holding a fix measured slower on its own, a failed guard, the confirmation
    # arm, a subset of the kept fixes: never taken, never even compared
    never = [
        _o("all", ["dataloader_workers", "channels_last"], 8.0),
        _o("all2", ["dataloader_workers", "torch_compile"], 8.0, quality_ok=False),
        _o("confirm", ["dataloader_workers", "torch_compile"], 8.0),
        _o("none", [], 8.0),
    ]

    def refuse(o: dict) -> dict:
        raise AssertionError(f"{o['name']} compared")

    assert wider_best([WORKERS, *never], WORKERS, refuse, {"channels_last"}) is None
    # nothing kept alone: an arm clearly faster than the baseline is the best, against it
    found = wider_best([COMPILE, ALL], None, refuse)
    assert found == (ALL, ALL)
    assert over_text({"over": over_json(None, ALL)}) is None  # "over the baseline": the ratio
    assert over_text({"fixes": ["x"]}) is None  # a result stored before the rule


def test_a_fix_that_pays_beside_another_is_kept_with_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    command = [sys.executable, str(JOBS / "plan_effects.py"), "--steps", "40", "--wait", "0.05"]
    command += ["--effect", "fused_optimizer=fast", "--effect", "cudnn_benchmark=stacked"]
    run_id, code = launch_run(command, home=home, max_steps=6, quiet=True)
    assert code == 0
    with RunStore(home) as store:
        result = run_experiment(
            # every trial (--full) of 16 steps: one step a loaded machine stretched 5x in
            # an 8-step trial of "all" (1.31-3.52x) left it unclear of fused_optimizer
            store,
            run_id,
            fixes=["fused_optimizer", "cudnn_benchmark"],
            steps=16,
            trials=2,
            full=True,
        )
    cands = {c["name"]: c for c in result["candidates"]}
    assert cands["fused_optimizer"]["verdict"] == "faster"
    best = result["best"]
    # cudnn_benchmark alone runs the baseline's very sleeps; beside a busy test session
    # they can still measure apart by chance, and each verdict has its own outcome:
    alone = cands["cudnn_benchmark"]["verdict"]
    if alone == "faster":  # kept alone: "all" is the kept combination, kept as it is
        assert best["fixes"] == ["fused_optimizer", "cudnn_benchmark"] and not best.get("over")
        return
    if alone == "slower":  # an arm holding a fix slower alone is never taken
        assert best["fixes"] == ["fused_optimizer"] and not best.get("over")
        return
    assert alone in ("no measurable change", "disagree")  # not kept alone: the rule's case
    assert best["candidate"] == "all" and best["fixes"] == ["fused_optimizer", "cudnn_benchmark"]
    assert best["over"]["candidate"] == "fused_optimizer" and best["over"]["ci"][0] > 1.0
    fixes = {f["id"]: f for f in result["fixes"]}
    assert fixes["fused_optimizer"]["kept"] and fixes["cudnn_benchmark"]["kept"]
    assert fixes["cudnn_benchmark"]["note"].startswith("kept with all: alone ")
    buf = io.StringIO()
    render(result, console(file=buf))
    text = " ".join(buf.getvalue().split())
    assert "Keep: fused_optimizer, cudnn_benchmark" in text
    assert f"; {over_text(best)})" in text
    # the Optimize page's answer says the same
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(verdict_page, args=(result,)).run()
    assert not at.exception
    shown = at.success[0].value
    assert shown.startswith("Keep **fused_optimizer, cudnn_benchmark**")
    assert f"measured; {over_text(best)})" in shown
