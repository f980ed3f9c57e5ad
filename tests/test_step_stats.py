"""Step summaries: the data-wait share is robust to a few outlier waits (one long pause
inside ``DataLoader.__next__`` is not an input pipeline), and keeps the share of a job
that really waits, on every step or once per round of its workers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from recordings import pause_40

from stepscope.analyzers.rules.thresholds import INPUT_HIGH, INPUT_MIN
from stepscope.analyzers.steps.step_stats import describe_wait_outliers, summarize_steps
from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"


def frame(waits: list[float], compute_s: float = 0.010, rank: int = 0) -> pd.DataFrame:
    """A steps table as the store returns it: each step waits, then computes."""
    rows, t = [], 1000.0
    for i, wait in enumerate(waits):
        end = t + wait + compute_s
        rows.append(
            {
                "run_id": 1,
                "rank": rank,
                "step": i,
                "start_s": t,
                "end_s": end,
                "data_wait_s": wait,
                "device_s": None,
                "batch_size": 4,
                "loss": 1.0,
                "kind": "optimizer",
                "profiled": 0,
            }
        )
        t = end
    return pd.DataFrame(rows)


def raw_share(summary: dict[str, Any]) -> float:
    return summary["data_wait_share_raw"]


# -- on DataFrames ---------------------------------------------------------------------
def test_one_long_pause_is_left_out_of_the_wait_share() -> None:
    waits = [0.0004] * 40
    waits[20] = 0.196  # one garbage-collection pause inside DataLoader.__next__
    s = summarize_steps(frame(waits))
    assert raw_share(s) > 0.30  # the ratio of sums: "highly input-bound"
    assert s["data_wait_share"] == pytest.approx(0.0004 / 0.0104, rel=1e-6)
    assert s["data_wait_share"] < INPUT_MIN
    out = s["data_wait_outliers"]
    assert out["count"] == 1 and out["steps"] == [20]
    assert out["max_s"] == pytest.approx(0.196)
    note = describe_wait_outliers(s)
    assert note == "1 step with a 196 ms wait left out as an outlier; median wait 0.4 ms"
    # the step-time figures still count the pause: the job did spend that time
    assert s["step_time_max_s"] == pytest.approx(0.206)


def test_a_few_irregular_pauses_are_outliers_too() -> None:
    waits = [0.0004] * 100
    waits[13], waits[71] = 0.150, 0.300
    s = summarize_steps(frame(waits))
    assert s["data_wait_outliers"]["count"] == 2
    assert s["data_wait_share"] < INPUT_MIN < raw_share(s)
    assert describe_wait_outliers(s).startswith("2 steps with waits of 150-300 ms left out")


def test_a_job_that_waits_on_every_step_keeps_its_share() -> None:
    rng = np.random.default_rng(0)
    waits = list(rng.normal(0.175, 0.01, 60).clip(0.1))
    waits[30] = 0.400  # one slower read among steps that all wait
    s = summarize_steps(frame(waits, compute_s=0.035))
    assert s["data_wait_share"] > INPUT_HIGH
    assert s["data_wait_share"] == pytest.approx(raw_share(s), abs=0.02)
    # beyond the fence and longer than a step, but 2.3 median waits: jitter, no outlier (a
    # loaded machine once gave such a job "1 step with a 43 ms wait left out", median 21)
    assert s["data_wait_outliers"] is None


def test_waits_once_per_round_of_many_workers_are_kept() -> None:
    # 32 workers that start together deliver their batches together: the loop waits
    # on one step in 32 (3 % of the steps), and that is the whole input cost
    waits = [0.0002] * 200
    for i in range(16, 200, 32):
        waits[i] = 0.300
    for workers in (None, 32):
        s = summarize_steps(frame(waits), workers=workers)
        assert s["data_wait_outliers"] is None
        assert s["data_wait_share"] == raw_share(s) > INPUT_HIGH
    # a short run of the same job has a single wait: only the worker count tells it apart
    short = summarize_steps(frame(waits[:60]), workers=32)
    assert short["data_wait_outliers"] is None and short["data_wait_share"] > INPUT_MIN


def test_long_waits_on_many_steps_are_not_outliers() -> None:
    waits = [0.0004] * 100
    for i in (3, 9, 20, 27, 41, 44, 58, 66, 80, 93):  # 10 % of the steps, irregular
        waits[i] = 0.120
    s = summarize_steps(frame(waits))
    assert s["data_wait_outliers"] is None
    assert s["data_wait_share"] == raw_share(s) > INPUT_HIGH


def test_short_blips_are_not_called_outliers() -> None:
    # above the fence, but far shorter than a step: they cannot move the share
    waits = [0.0004] * 100
    waits[50] = 0.003
    s = summarize_steps(frame(waits))
    assert s["data_wait_outliers"] is None and describe_wait_outliers(s) is None


def test_outliers_are_found_across_ranks() -> None:
    a = [0.0004] * 40
    b = [0.0004] * 40
    b[25] = 0.250
    s = summarize_steps(pd.concat([frame(a), frame(b, rank=1)], ignore_index=True))
    assert s["data_wait_outliers"]["count"] == 1
    assert s["data_wait_outliers"]["steps"] == [25]
    assert s["data_wait_share"] < INPUT_MIN


def test_one_pause_in_a_short_run_is_an_outlier_too() -> None:
    waits = [0.0004] * 17  # 15 timed steps after 2 of warm-up: one step is 6.7 %
    waits[9] = 0.196
    s = summarize_steps(frame(waits))
    assert s["timed_steps"] == 15 and s["data_wait_outliers"]["count"] == 1
    assert s["data_wait_share"] < INPUT_MIN
    # too few steps to tell an accident from a habit: nothing is left out
    short = [0.0004] * 8
    short[5] = 0.196
    few = summarize_steps(frame(short))
    assert few["timed_steps"] == 7 and few["data_wait_outliers"] is None


def with_phases(
    df: pd.DataFrame, forward: float, backward: float, optimizer: float
) -> pd.DataFrame:
    return df.assign(forward_s=forward, backward_s=backward, optimizer_s=optimizer)


def test_phases_are_mean_seconds_and_shares_of_the_timed_steps() -> None:
    # 10 ms steps that wait 2 ms: 3 ms forward, 3 ms backward, 1 ms optimizer, 1 ms other
    df = with_phases(frame([0.002] * 20, compute_s=0.008), 0.003, 0.003, 0.001)
    df.loc[0, ["forward_s", "end_s"]] = [1.0, df.loc[0, "end_s"] + 1.0]  # warm-up: left out
    df.loc[1:, ["start_s", "end_s"]] += 1.0
    s = summarize_steps(df)
    assert s["warmup_steps"] == 2 and s["timed_steps"] == 18
    phases = s["phases"]
    assert list(phases) == ["data_wait", "forward", "backward", "optimizer", "other"]
    expected = {"data_wait": 0.002, "forward": 0.003, "backward": 0.003, "optimizer": 0.001}
    expected["other"] = 0.001
    for name, mean in expected.items():
        assert phases[name]["mean_s"] == pytest.approx(mean, abs=1e-9)
        assert phases[name]["share"] == pytest.approx(mean / 0.010, abs=1e-6)
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)


def test_other_is_never_below_zero_and_shares_still_add_to_one() -> None:
    # clock jitter: the phases overrun a 10 ms step by 0.1 ms
    df = with_phases(frame([0.0] * 10, compute_s=0.010), 0.005, 0.004, 0.0011)
    phases = summarize_steps(df)["phases"]
    assert phases["other"]["mean_s"] == 0.0
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
    assert phases["forward"]["share"] == pytest.approx(0.005 / 0.0101)


def test_runs_without_phases_have_none() -> None:
    """Rows of a store older than version 4 (no columns) or of an attached process
    (NULL): unknown, not zero; every other figure is still there."""
    old = summarize_steps(frame([0.001] * 10))
    assert old["phases"] is None and old["step_time_median_s"] == pytest.approx(0.011)
    nulls = summarize_steps(with_phases(frame([0.001] * 10), None, None, None))
    assert nulls["phases"] is None
    assert summarize_steps(frame([]))["phases"] is None


# -- on real runs ----------------------------------------------------------------------
def _record(home: Path, *args: str) -> pd.DataFrame:
    run_id, code = launch_run([sys.executable, *args], home=home, quiet=True)
    assert code == 0
    with RunStore(home) as store:
        return store.steps(run_id)


def test_real_run_with_one_pause(tmp_path_factory: pytest.TempPathFactory) -> None:
    # 40 steps of 10 ms; sample 80 (step 20) sleeps 200 ms once
    home, run_id = pause_40(tmp_path_factory, "pause")
    with RunStore(home) as store:
        steps = store.steps(run_id)
    assert len(steps) == 40
    s = summarize_steps(steps)
    assert raw_share(s) > INPUT_HIGH  # what the ratio of sums said
    assert s["data_wait_share"] < INPUT_MIN
    assert s["data_wait_outliers"]["steps"] == [20]
    assert s["data_wait_outliers"]["max_s"] > 0.19
    assert "left out as an outlier" in describe_wait_outliers(s)


def test_real_input_bound_run_with_workers_keeps_its_share(tmp_path: Path) -> None:
    # 2 workers, 8 samples of 4 ms each per batch: a batch every ~16 ms, ~1 ms of model
    args = ("--steps", "30", "--workers", "2", "--sleep", "0.004", "--batch", "8")
    steps = _record(tmp_path, str(JOBS / "train.py"), *args)
    s = summarize_steps(steps, workers=2)
    # the steady wait is the share, never left out as outliers; on a busy machine a batch
    # whose worker was preempted may stall once (54 ms against ~16 ms seen beside two busy
    # processes), and that one step may be
    outliers = s["data_wait_outliers"]
    assert outliers is None or outliers["count"] <= 2
    assert s["data_wait_share"] > INPUT_HIGH and raw_share(s) > INPUT_HIGH
    # the same share among the phases: data wait, then forward, backward, optimizer
    assert s["phases"]["data_wait"]["share"] == pytest.approx(raw_share(s), abs=0.02)
    assert s["phases"]["forward"]["mean_s"] > 0 and s["phases"]["optimizer"]["mean_s"] > 0


def test_a_pause_beside_short_waits_over_the_fence_is_still_an_outlier() -> None:
    # a busy machine: the first batch after each validation loop waits 10-20 ms, which
    # clears the fence too; the one 0.2 s pause still holds nearly all the waiting
    waits = [0.0004] * 24
    waits[6], waits[9], waits[12] = 0.012, 0.200, 0.015
    s = summarize_steps(frame(waits, compute_s=0.040))
    assert s["data_wait_outliers"]["steps"] == [9]
    assert s["data_wait_share"] < INPUT_MIN < raw_share(s)
    # the short waits stay in the share
    assert (
        s["data_wait_share"]
        > summarize_steps(frame([0.0004] * 24, compute_s=0.040))["data_wait_share"]
    )


def test_a_parent_that_tests_the_model_is_not_a_training_worker() -> None:
    # hogwild: two workers train (64 samples a step, 10 ms), then the parent tests the
    # model in one forward of 1,000 samples (70 ms): 14,000 samples/s of its own, which
    # made the run read 24,294 samples/s where the workers did about 9,000 (issue 39)
    workers = [frame([0.001] * 20).assign(worker=w, batch_size=64) for w in (1, 2)]
    parent = frame([0.0], compute_s=0.070).assign(worker=0, batch_size=1000, kind="forward", step=0)
    parent[["start_s", "end_s"]] += 1.0  # after the workers joined
    s = summarize_steps(pd.concat([*workers, parent], ignore_index=True))
    alone = summarize_steps(pd.concat(workers, ignore_index=True))
    assert s["steps"] == 41 and s["evaluation_steps"] == 1 and s["workers"] == 2
    for figure in ("samples_per_s", "step_time_median_s", "step_time_max_s", "timed_steps"):
        assert s[figure] == alone[figure], figure
    assert s["samples_per_s"] == pytest.approx(2 * 64 / 0.011, rel=1e-6)
    # every row counted once: evaluation, warm-up, profiled and timed add up
    left = s["left_out"]
    assert s["evaluation_steps"] + left["warmup"] + left["profiled"] + s["timed_steps"] == 41
    assert left["warmup"] == 4  # two workers' 2 each: one process's is warmup_steps
    assert s["warmup_steps"] == 2


def test_an_inference_job_alone_keeps_its_forward_steps() -> None:
    # forwards are evaluation only beside a process that trained
    s = summarize_steps(frame([0.001] * 10).assign(kind="forward", worker=0))
    assert s["evaluation_steps"] == 0 and s["timed_steps"] == 9
