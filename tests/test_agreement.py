"""A fix is kept only when throughput and the median step agree (issue 27, part 2).

"1.27x faster" on throughput beside a median step ratio of 1.00x was kept on the one
statistic while the other said no change. These tests build the arms' steps directly
(a store that only serves step tables) and judge them as an experiment does
(``verdict.evaluate``, ``per_fix``, ``pick_best``), fast and deterministically: the
step times are synthetic, seeded, and far apart where a verdict must be clear.
"""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import ablation_page

from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console
from stepscope.optim_runner.experiment.adaptive import Interval, decide
from stepscope.optim_runner.experiment.design import interval
from stepscope.optim_runner.guards.quality import QualityCheck
from stepscope.optim_runner.speedup.agreement import DISAGREE, check_agreement
from stepscope.optim_runner.speedup.stats import SpeedupCI
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trials import Arm
from stepscope.optim_runner.verdict import verdict

STEPS = 60


def _frame(times: np.ndarray, batch: int = 32) -> pd.DataFrame:
    """One trial's steps as the store gives them: back to back, rank 0, a flat loss."""
    start = np.concatenate([[0.0], np.cumsum(times)[:-1]])
    n = len(times)
    return pd.DataFrame(
        {
            "run_id": 0,
            "rank": 0,
            "worker": 0,
            "step": np.arange(n),
            "start_s": start,
            "end_s": start + times,
            "data_wait_s": 0.0,
            "device_s": None,
            "batch_size": batch,
            "loss": 1.0,
            "kind": "train",
            "profiled": 0,
            "forward_s": None,
            "backward_s": None,
            "optimizer_s": None,
        }
    )


def _times(seed: int, typical: float, slow_every: int = 0, slow: float = 0.0) -> np.ndarray:
    """``STEPS`` step times around ``typical`` (2 % noise); every ``slow_every``-th step
    takes ``slow`` seconds instead (a stall the median leaves out, the mean does not)."""
    rng = np.random.default_rng(seed)
    out = typical * (1.0 + 0.02 * rng.standard_normal(STEPS))
    if slow_every:
        out[::slow_every] = slow
    return out


class _Store:
    """Only what ``evaluate`` and ``annotate`` read: each run's step table."""

    def __init__(self, frames: dict[int, pd.DataFrame]) -> None:
        self.frames = frames

    def steps(self, run_id: int) -> pd.DataFrame:
        return self.frames[run_id]

    def requests(self, run_id: int) -> None:
        return None


@pytest.fixture(autouse=True)
def _losses_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard passes: these tests are about speed (tests/test_experiment.py has the
    guard on real losses)."""
    ok = QualityCheck(True, "the losses agree step by step", 0.0, 0.05)
    monkeypatch.setattr(verdict, "guard_candidate", lambda *a, **k: ok)


def _judge(base: list[np.ndarray], cand: list[np.ndarray], batch: int = 32) -> dict[str, Any]:
    """``evaluate`` of one candidate (``cudnn_benchmark`` alone) against the baseline."""
    frames = {i: _frame(t) for i, t in enumerate(base)}
    frames.update({10 + i: _frame(t, batch) for i, t in enumerate(cand)})
    store = _Store(frames)
    baseline = Arm("baseline", "baseline", [])
    baseline.runs = list(range(len(base)))
    fix = PlannedFix(id="cudnn_benchmark", finding="compute/cudnn")
    arm = Arm("cudnn_benchmark", "alone", [fix])
    arm.runs = [10 + i for i in range(len(cand))]
    outcome = verdict.evaluate(store, arm, baseline, tolerance=0.05)
    fixes = verdict.per_fix(store, [fix], [arm], {arm.name: outcome}, baseline, 0.05)
    best = verdict.pick_best([outcome], {f for f in fixes if fixes[f]["kept"]})
    verdict.annotate(store, fixes, best or verdict.no_best(), baseline.runs, 0)
    return {"outcome": outcome, "fix": fixes[fix.id], "best": best}


def test_a_gain_on_both_statistics_is_kept_as_faster() -> None:
    judged = _judge([_times(1, 0.2), _times(2, 0.2)], [_times(3, 0.1), _times(4, 0.1)])
    out = judged["outcome"]
    assert out["verdict"] == "faster" and out["speedup_basis"] == "samples_per_s"
    assert out["ci"][0] > 1.0 and out["step_time"]["ci"][0] > 1.0
    assert out["agreement"]["agrees"] is True and out["agreement"]["text"] is None
    assert out["agreement"]["basis"] == "median step"
    assert judged["fix"]["kept"] is True and judged["fix"]["note"] is None
    assert judged["best"]["name"] == "cudnn_benchmark"


def test_a_gain_on_throughput_alone_is_not_kept_and_says_why() -> None:
    """The baseline's stalls (every 5th step 0.6 s) make its mean twice the candidate's;
    its typical step is the candidate's: throughput says faster, the median no change."""
    base = [_times(1, 0.1, slow_every=5, slow=0.6), _times(2, 0.1, slow_every=5, slow=0.6)]
    judged = _judge(base, [_times(3, 0.1), _times(4, 0.1)])
    out = judged["outcome"]
    assert out["ci"][0] > 1.0  # throughput alone would have called it faster
    assert out["step_time"]["verdict"] == "no measurable change"
    assert out["verdict"] == DISAGREE != "faster"
    text = out["agreement"]["text"]
    assert out["agreement"]["agrees"] is False
    assert text.startswith(f"throughput {out['speedup']:.2f}x but median step ")
    assert "a few slow steps in the baseline weigh on its mean" in text
    fix = judged["fix"]
    assert fix["kept"] is False and fix["verdict"] == DISAGREE
    assert fix["disagreement"] == text and text in fix["note"]
    assert judged["best"] is None  # nothing kept: the job stays as it is


def test_a_median_too_noisy_to_tell_says_so_not_slow_steps() -> None:
    """Equal skews on both sides: the gap is the median's wider interval, not stalls."""
    arr = np.array([0.1, 0.11, 0.12, 0.1])
    throughput = SpeedupCI(1.30, 1.10, 1.50, 0.95, "faster", 40, 40, "percentile")
    step = SpeedupCI(1.25, 0.95, 1.60, 0.95, "no measurable change", 40, 40, "percentile")
    arm = SimpleNamespace(step_times=arr, sec_per_sample=arr / 32, batch=32.0)
    result = check_agreement(throughput, step, arm, arm)
    assert not result.agrees
    assert "median step's interval includes 1: too few timed steps" in result.text
    # a slower or unchanged throughput needs no second opinion; nor does a missing median
    slower = SpeedupCI(0.8, 0.7, 0.9, 0.95, "slower", 40, 40, "percentile")
    assert check_agreement(slower, step, arm, arm).agrees
    assert check_agreement(throughput, None, arm, arm).agrees


def test_a_larger_batch_is_checked_per_sample_and_says_so() -> None:
    """64 samples a step in 0.15 s against 32 in 0.1 s: each step is slower, each sample
    faster; the median step ratio (0.67x) is not the figure, the per-sample median is."""
    judged = _judge([_times(1, 0.1), _times(2, 0.1)], [_times(3, 0.15)], batch=64)
    out = judged["outcome"]
    assert out["step_time"]["ratio"] < 1.0 and out["verdict"] == "faster"
    agreement = out["agreement"]
    assert agreement["agrees"] and agreement["basis"] == "median time per sample"
    assert agreement["ratio"] == pytest.approx(4 / 3, rel=0.05)
    assert "with 64 samples a step against 32" in agreement["text"]
    assert judged["fix"]["kept"] is True


def test_the_adaptive_design_does_not_end_on_a_gain_the_median_disputes() -> None:
    """Its throughput is clear of 1, but not faster as the verdict says it: more trials
    may settle the median, so the experiment goes on (it still ranks on throughput)."""
    outcome = {"speedup": 1.27, "ci": [1.15, 1.4], "verdict": DISAGREE, "quality_ok": True}
    arm = Arm("all", "all", [])
    arm.runs = [1, 2]
    disputed = interval(arm, outcome)
    assert disputed.agrees is False and not disputed.clearly_faster
    assert decide([disputed], baseline_trials=2).end is None
    agreed = interval(arm, dict(outcome, verdict="faster"))
    assert decide([agreed], baseline_trials=2).end.startswith("all is clearly faster")
    # leaders end it only when all of them agree
    other = Interval("fused", 2, 1.2, 1.1, 1.3)
    assert decide([agreed, other], baseline_trials=2).end is not None
    assert decide([disputed, other], baseline_trials=2).end is None


def test_the_cli_says_why_a_candidate_disagrees() -> None:
    text = "throughput 1.27x but median step 1.00x (0.97-1.03x): a few slow steps ..."
    cand = {
        "name": "all",
        "kind": "all",
        "fixes": ["fused_optimizer"],
        "status": "completed",
        "error": None,
        "runs": [3],
        "speedup": 1.27,
        "ci": [1.15, 1.4],
        "verdict": DISAGREE,
        "quality_ok": True,
        "quality": {"reason": "ok"},
        "agreement": {"agrees": False, "basis": "median step", "text": text},
    }
    result = {
        "experiment_id": 1,
        "baseline_run": 1,
        "steps": 10,
        "trials": 2,
        "baseline": {"step_time_median_s": 0.1, "warmup": {"steps": 2}},
        "candidates": [cand],
        "fixes": [],
        "best": verdict.no_best(),
    }
    buf = io.StringIO()
    render(result, console(file=buf))
    out = buf.getvalue()
    assert "disagree" in out and "a few slow steps" in out
    assert "Keep:" not in out


def test_the_page_says_why_a_candidate_disagrees_in_its_row() -> None:
    from streamlit.testing.v1 import AppTest

    text = "throughput 1.27x but median step 1.00x (0.97-1.03x): a few slow steps ..."
    arm = {"fixes": ["fused_optimizer"], "status": "completed", "quality_ok": True}
    result = {
        "trials": 2,
        "candidates": [
            {**arm, "name": "all", "speedup": 1.27, "ci": [1.15, 1.4], "runs": [3],
             "verdict": DISAGREE, "step_time": {"ratio": 1.0, "ci": [0.97, 1.03]},
             "agreement": {"agrees": False, "text": text}},
        ],
    }  # fmt: skip
    at = AppTest.from_function(ablation_page, args=(result,)).run()
    assert not at.exception
    row = at.dataframe[0].value.set_index("candidate").loc["all"]
    assert row["verdict"] == DISAGREE and row["why"] == text
    assert row["median step ratio"] == pytest.approx(1.0)
