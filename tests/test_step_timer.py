"""Step detection and per-step figures, on real jobs run under the bootstrap."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def _run(tmp_path, script, *args, **kw):
    run_id, proc = jobs.run_job(tmp_path, script, *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return run_id, proc, jobs.steps(tmp_path, run_id)


def test_optimizer_steps_counted_exactly_with_batch_and_loss(tmp_path):
    _, proc, df = _run(tmp_path, "train.py", "--steps", "7", "--accum", "2")
    assert proc.stdout == "done\n"
    assert list(df["step"]) == list(range(7))
    assert set(df["kind"]) == {"optimizer"}
    # two micro-batches of 8 per optimizer step: batch sizes add up within a step
    assert list(df["batch_size"]) == [16] * 7
    assert df["loss"].map(math.isfinite).all() and (df["loss"] > 0).all()
    # steps tile time: each starts where the previous ended (or later, never earlier)
    assert (df["start_s"].iloc[1:].values >= df["end_s"].iloc[:-1].values).all()
    assert (df["end_s"] > df["start_s"]).all()
    assert df["device_s"].isna().all()  # CPU job: no CUDA events


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_dataloader_workers_record_nothing(tmp_path, start):
    args = ["--steps", "6", "--workers", "2", "--transform"]
    if start == "spawn":
        args.append("--spawn")
    _, _, df = _run(tmp_path, "train.py", *args)
    assert list(df["step"]) == list(range(6))
    assert set(df["kind"]) == {"optimizer"} and set(df["rank"]) == {0}
    assert list(df["batch_size"]) == [8] * 6


def test_two_optimizers_count_one_step_per_iteration(tmp_path):
    _, _, df = _run(tmp_path, "gan.py")
    assert list(df["step"]) == list(range(7))


@pytest.mark.parametrize("grad", [False, True])
def test_inference_counts_outermost_forwards_only(tmp_path, grad):
    args = ("--calls", "9") + (("--grad",) if grad else ())
    _, _, df = _run(tmp_path, "infer.py", *args)
    assert list(df["step"]) == list(range(9))  # nested Block/Linear calls are not steps
    assert set(df["kind"]) == {"forward"}


def test_mark_step_overrides_optimizer_steps(tmp_path):
    run_id, _, df = _run(tmp_path, "mark.py", "--marks", "4")
    assert list(df["step"]) == list(range(4))
    assert set(df["kind"]) == {"mark"}
    messages = " ".join(jobs.events(tmp_path, run_id)["message"])
    assert "replaced by marks" in messages


def test_late_marks_leave_no_hook_steps_behind(tmp_path):
    """6 optimizer steps are written before the first of only 2 marks: the marks
    take over steps 0-1 and the 4 surplus hook rows must not survive."""
    _, _, df = _run(tmp_path, "mark.py", "--lead", "6", "--marks", "2")
    assert set(df["kind"]) == {"mark"}
    assert list(df["step"]) == [0, 1]


def _data_wait_share(df):
    df = df[df["step"] > 0]  # step 0 also creates the loader's iterator
    return df["data_wait_s"].sum() / (df["end_s"] - df["start_s"]).sum()


def test_data_wait_high_for_slow_dataset_low_for_in_memory(tmp_path):
    slow_args = ("--steps", "5", "--sleep", "0.01", "--batch", "4")
    _, _, slow = _run(tmp_path / "slow", "train.py", *slow_args)
    _, _, fast = _run(tmp_path / "fast", "train.py", "--steps", "5", "--compute", "8")
    assert _data_wait_share(slow) > 0.8
    # a loose bound: the test machine's cores are shared, the contrast is what counts
    assert _data_wait_share(fast) < 0.2
    assert list(slow["batch_size"]) == [4] * 5


def test_max_steps_stops_the_job_cleanly(tmp_path):
    run_id, proc, df = _run(tmp_path, "train.py", "--steps", "1000", max_steps=4)
    assert proc.returncode == 0
    assert "done" not in proc.stdout  # stopped inside the loop
    assert "Traceback" not in proc.stderr
    assert list(df["step"]) == [0, 1, 2, 3]
    row = jobs.run_row(tmp_path, run_id)
    assert row["stop_reason"] == "max_steps" and row["error"] is None


@pytest.mark.parametrize(
    ("what", "source_msg", "expect_steps"),
    [("batch", "data wait disabled", 10), ("step", "step timer disabled", 0)],
)
def test_a_failing_collector_disables_itself_not_the_job(tmp_path, what, source_msg, expect_steps):
    run_id, proc, df = _run(tmp_path, "broken_collector.py", "--what", what)
    assert proc.stdout == "trained 10 steps\n"
    assert proc.stderr == ""
    assert len(df) == expect_steps
    ev = jobs.events(tmp_path, run_id)
    warnings = ev[ev["level"] == "warning"]["message"].tolist()
    assert len(warnings) == 1 and warnings[0].startswith(source_msg)


def test_job_facts_record_the_settings_the_job_runs_with(tmp_path):
    """The diagnosis reads these to skip fixes in effect (issue 4): they must be the
    job's real objects' settings, seen from inside the job."""
    run_id, _, _ = _run(tmp_path, "train.py", "--steps", "3", "--workers", "1")
    facts = jobs.run_row(tmp_path, run_id)["facts"]
    (loader,) = facts["dataloaders"]
    assert loader["num_workers"] == 1 and loader["batch_size"] == 8
    assert loader["pin_memory"] is False and loader["dataset"] == "Data"
    assert facts["optimizer"]["class"] == "SGD" and facts["optimizer"]["param_tensors"] == 4
    model = facts["model"]
    assert model["class"] == "Net" and model["wrapper"] is None and not model["compiled"]
    assert model["parameters"] == 16 * 32 + 32 + 32 + 1 and model["input_shape"] == [8, 16]
    assert model["conv2d"] is False and "autocast" not in model
    assert facts["settings"]["threads"] == 1  # the job's torch.set_num_threads(1)


# -- loops as real scripts write them (issue 12: defects found on real scripts) ----------
def _reported(proc) -> list[float]:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("LOSSES "))
    return json.loads(line.split(" ", 1)[1])


@pytest.mark.parametrize("pattern", ["eval-first", "eval-no-optim"])
def test_evaluation_forwards_before_training_are_not_steps(tmp_path, pattern):
    """nanoGPT evaluates before its first iteration: those forwards are not steps, and
    the capture scheduled at step 2 lands on training steps."""
    run_id, proc, df = _run(
        tmp_path, "loops.py", "--pattern", pattern, profile_at=2, profile_steps=2
    )
    assert list(df["step"]) == list(range(8))
    assert set(df["kind"]) == {"optimizer"}
    # the scaled micro-batch losses add up to the loss the script reports
    assert df["loss"].tolist() == pytest.approx(_reported(proc), rel=1e-5)
    arts = jobs.artifacts(tmp_path, run_id)
    assert len(arts[arts["kind"] == "trace"]) == 1
    if pattern == "eval-first":  # an optimizer existed: the eval forwards were never steps
        assert df["profiled"].astype(bool).tolist()[2:4] == [True, True]
    # else the capture ran on the evaluation (then an inference job): it is kept, not redone


def test_hand_written_updates_stop_at_the_limit_with_their_capture(tmp_path):
    """No torch.optim: forward steps are written one by one, so --max-steps and the
    capture hold (this job used to run 38 steps for a limit of 30, capture lost)."""
    run_id, proc, df = _run(
        tmp_path,
        "loops.py",
        "--pattern",
        "manual",
        "--iters",
        "200",
        max_steps=30,
        profile_at=10,
        profile_steps=3,
    )
    assert list(df["step"]) == list(range(30))
    assert set(df["kind"]) == {"forward"}
    assert df["profiled"].astype(bool).tolist()[10:13] == [True] * 3
    arts = jobs.artifacts(tmp_path, run_id)
    trace = arts[arts["kind"] == "trace"]
    assert len(trace) == 1 and trace["meta"].iloc[0]["steps"] == 3


def test_gan_step_ends_at_the_last_optimizer_with_the_first_ones_loss(tmp_path):
    _, proc, df = _run(tmp_path, "loops.py", "--pattern", "gan")
    assert list(df["step"]) == list(range(8))
    # Loss_D = err_real + err_fake, as the script prints it (not mixed with Loss_G)
    assert df["loss"].tolist() == pytest.approx(_reported(proc), rel=1e-5)


def test_steps_after_a_capture_are_flagged(tmp_path):
    _, _, df = _run(tmp_path, "train.py", "--steps", "12", profile_at=3, profile_steps=2)
    flags = df["profiled"].astype(bool).tolist()
    assert flags == [False] * 3 + [True] * 4 + [False] * 5  # 2 captured + 2 after


def test_look_ahead_loader_does_not_double_the_first_batch(tmp_path):
    _, _, df = _run(tmp_path, "loops.py", "--pattern", "lookahead")
    assert list(df["batch_size"]) == [8] * 8


# -- the phases of a step (issue 14) ----------------------------------------------------
PHASE_COLUMNS = ["data_wait_s", "forward_s", "backward_s", "optimizer_s"]


def _step_time(df):
    return df["end_s"] - df["start_s"]


def _exclusive(df) -> None:
    """Phases are exclusive: none below 0, and together they fit in their step (2 %:
    the phases are read on another clock than the step's ends)."""
    phases = df[PHASE_COLUMNS]
    assert phases.notna().all().all() and (phases >= 0).all().all()
    assert (phases.sum(axis=1) <= 1.02 * _step_time(df)).all()


def test_phases_of_a_plain_adamw_loop(tmp_path):
    """The per-parameter AdamW update (foreach=False) is a large share of a small MLP's
    step; forward is still timed once the global forward hooks are gone (step 1 on)."""
    from stepscope.analyzers.steps.step_stats import summarize_steps

    _, _, df = _run(tmp_path, "phases_train.py", "--pattern", "loop")
    assert list(df["step"]) == list(range(12)) and set(df["kind"]) == {"optimizer"}
    _exclusive(df)
    assert (df["forward_s"] > 0).all() and (df["backward_s"] > 0).all()
    assert (df["optimizer_s"] > 0).all() and (df["data_wait_s"] == 0).all()
    summary = summarize_steps(df)
    phases = summary["phases"]
    assert list(phases) == ["data_wait", "forward", "backward", "optimizer", "other"]
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
    assert phases["optimizer"]["share"] >= 0.2
    # the four phases and "other" make up the mean step
    total = sum(p["mean_s"] for p in phases.values())
    assert total == pytest.approx(summary["step_time_mean_s"], rel=0.02)


def test_phases_of_a_closure_step_are_forward_and_backward(tmp_path):
    """optimizer.step(closure), as Lightning runs it: the closure's forward and backward
    run inside the optimizer step and count as forward and backward, not optimizer."""
    sleep = 0.005  # the closure's own work (Lightning's hooks): "other", not optimizer
    _, _, df = _run(
        tmp_path, "phases_train.py", "--pattern", "closure", "--closure-sleep", str(sleep)
    )
    assert list(df["step"]) == list(range(12)) and set(df["kind"]) == {"optimizer"}
    _exclusive(df)
    assert (df["forward_s"] > 0).all() and (df["backward_s"] > 0).all()
    rest = _step_time(df) - df["forward_s"] - df["backward_s"]
    assert (df["optimizer_s"] > 0).all() and (df["optimizer_s"] < rest - sleep).all()


def test_phases_of_inference_are_forward_only(tmp_path):
    _, _, df = _run(tmp_path, "phases_train.py", "--pattern", "infer")
    assert list(df["step"]) == list(range(12)) and set(df["kind"]) == {"forward"}
    _exclusive(df)
    assert (df["forward_s"] > 0).all()
    assert (df["backward_s"] == 0).all() and (df["optimizer_s"] == 0).all()


def test_phases_of_two_optimizers_add_up_over_the_iteration(tmp_path):
    """One step spans D's and G's updates: both backward calls and both optimizer steps
    are in it, and the first iteration (held while the cycle is learned) has them too."""
    _, _, df = _run(tmp_path, "gan.py")
    assert list(df["step"]) == list(range(7))
    _exclusive(df)
    assert (df[["forward_s", "backward_s", "optimizer_s"]] > 0).all().all()


def test_phases_after_the_switch_to_marks(tmp_path):
    """Marked steps keep their phases: the forward hooks move to the outermost module."""
    _, _, df = _run(tmp_path, "mark.py", "--lead", "3", "--marks", "4")
    assert list(df["step"]) == list(range(4)) and set(df["kind"]) == {"mark"}
    _exclusive(df)
    assert (df[["forward_s", "backward_s", "optimizer_s"]] > 0).all().all()


def test_phase_stack_charges_the_innermost_phase_only(monkeypatch):
    """A fetch inside a forward is data wait, a closure's backward inside the optimizer
    step is backward, and a phase an exception left open is closed by its outer one."""
    from stepscope.collectors.steps import step_accounting as acc
    from stepscope.collectors.steps.step_timer import StepTimer

    clock = iter(range(100))
    monkeypatch.setattr(acc, "perf_counter", lambda: float(next(clock)))
    timer = StepTimer(lambda: None)
    accounting = timer.accounting
    accounting.phase_enter(acc.OPTIMIZER)  # t=0
    accounting.phase_enter(acc.FORWARD)  # t=1: optimizer 1
    accounting.phase_enter(acc.DATA)  # t=2: forward 1
    accounting.phase_exit(acc.DATA)  # t=3: data 1
    accounting.phase_exit(acc.FORWARD)  # t=4: forward 2
    accounting.phase_enter(acc.BACKWARD)  # t=5: optimizer 2
    accounting.phase_enter(acc.FORWARD)  # t=6: backward 1, never closed
    accounting.phase_exit(acc.BACKWARD)  # t=7: forward 3, backward closed with it
    accounting.phase_exit(acc.OPTIMIZER)  # t=8: optimizer 3
    accounting.phase_exit(acc.OPTIMIZER)  # not open: nothing
    assert timer.data_wait == 1.0 and timer.phase_s == [3.0, 1.0, 3.0]
    accounting.phase_enter(acc.FORWARD)  # t=9
    row = accounting.take_row("forward", 0.0)  # t=10: a step ending inside a forward
    assert (row["forward_s"], row["backward_s"], row["optimizer_s"]) == (4.0, 1.0, 3.0)
    assert row["data_wait_s"] == 1.0 and timer.phase_s == [0.0, 0.0, 0.0]
    accounting.phase_exit(acc.FORWARD)  # t=11: the rest is the next step's
    assert timer.phase_s == [1.0, 0.0, 0.0]


def test_merged_rows_sum_their_phases():
    from stepscope.collectors.steps.step_row import merge_rows

    def row(start, f, b, o):
        return {
            "start_s": start, "end_s": start + 1, "data_wait_s": 0.5, "batch_size": 2,
            "_batches": 1, "_losses": [], "profiled": False,
            "forward_s": f, "backward_s": b, "optimizer_s": o,
        }  # fmt: skip

    merged = merge_rows(row(0, 0.1, 0.2, 0.3), row(1, 0.01, 0.02, 0.03))
    assert merged["start_s"] == 0 and merged["data_wait_s"] == 1.0
    assert (merged["forward_s"], merged["backward_s"], merged["optimizer_s"]) == pytest.approx(
        (0.11, 0.22, 0.33)
    )


@pytest.mark.parametrize(
    "pattern, steps",
    [("stages", 12), ("sidecar", 7), ("sidecar-first", 7)],
)
def test_optimizers_that_take_turns_by_phase_count_every_step(tmp_path, pattern, steps):
    """A two-stage fine-tune (a new optimizer for stage 2) counts both stages' steps,
    each with its own loss; an optimizer that steps now and then inside an iteration,
    after or before the first one, starts nothing: one step per iteration."""
    _, proc, df = _run(
        tmp_path,
        "optimizer_phases.py",
        "--pattern",
        pattern,
        "--steps",
        str(6 if pattern == "stages" else 7),
    )
    printed = [float(line.split()[1]) for line in proc.stdout.splitlines()]
    assert list(df["step"]) == list(range(steps)) and len(printed) == steps
    assert df["loss"].tolist() == pytest.approx(printed, abs=1e-6)
    assert (df["start_s"].iloc[1:].values >= df["end_s"].iloc[:-1].values).all()
