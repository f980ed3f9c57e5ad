"""Hogwild training (examples/corpus/mnist_hogwild.py) under `stepscope run`: processes the
job starts itself with torch.multiprocessing, sharing one model, no distributed ranks.

Each training process is a worker of the run with its own series of steps (the store's
``steps.worker``): none of them overwrites another's rows, whatever starts them (spawn,
the example's way; fork; a Pool under forkserver, ended by the pool's SIGTERM). The
parent's own test pass after them is not a training step: an evaluation step, out of the
training figures. One process takes the rank's default capture, and the verdict printed at
exit rests on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stepscope.store import RunStore
from tests.test_corpus import CORPUS, stepscope

pytestmark = pytest.mark.slow

STARTS = {
    # the example's own way, at its shape: 2 processes x 94 batches of 64
    "spawn": (),
    "fork": ("--start-method", "fork", "--train-size", "1920"),
    "pool_forkserver": ("--pool", "--start-method", "forkserver", "--train-size", "1920"),
}


@pytest.fixture(scope="module", params=list(STARTS))
def hogwild(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp(request.param)
    script = str(CORPUS / "mnist_hogwild.py")
    proc = stepscope(home, "run", "--", "python", script, *STARTS[request.param])
    assert proc.returncode == 0, proc.stderr[-3000:]
    corpus = [ln for ln in proc.stdout.splitlines() if ln.startswith("CORPUS ")]
    assert len(corpus) == 1, proc.stdout[-3000:]
    shown = stepscope(home, "show", "last", "--json")
    assert shown.returncode == 0, shown.stderr
    with RunStore(home) as store:
        run_id = store.resolve_run("last")
        return {
            "start": request.param,
            "proc": proc,
            "corpus": json.loads(corpus[0].removeprefix("CORPUS ")),
            "steps": store.steps(run_id),
            "artifacts": store.artifacts(run_id),
            "show": json.loads(shown.stdout),
        }


def test_each_training_process_is_a_worker_with_all_its_steps(hogwild: dict) -> None:
    steps, corpus = hogwild["steps"], hogwild["corpus"]
    per_process = corpus["per_process"]
    assert len(per_process) == 2 and corpus["iterations"] == sum(per_process)
    trained = steps[steps["worker"] > 0]
    counts = trained.groupby("worker").size()
    assert sorted(counts.tolist()) == sorted(per_process), steps.groupby("worker").size()
    for _, rows in trained.groupby("worker"):
        assert rows["step"].tolist() == list(range(len(rows)))
        assert set(rows["kind"]) == {"optimizer"}
        batch = rows["batch_size"].to_numpy()  # the epoch's last batch holds the rest
        assert (batch[:-1] == corpus["batch_size"]).all() and 0 < batch[-1] <= batch[0]
    # each worker's last step has the loss that worker reported last
    last = sorted(rows["loss"].iloc[-1] for _, rows in trained.groupby("worker"))
    expected = sorted(corpus["losses"])
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(last, expected, strict=True)), last
    # the parent trains nothing: at most its one test batch, a forward
    parent = steps[steps["worker"] == 0]
    assert len(parent) <= 1 and set(parent["kind"]) <= {"forward"}
    assert set(steps["rank"]) == {0}


def test_launcher_show_and_verdict_count_the_workers(hogwild: dict) -> None:
    stderr, summary = hogwild["proc"].stderr, hogwild["show"]
    assert "2 training worker processes" in stderr, stderr[-2000:]
    assert summary["workers"] == 2
    assert sorted(summary["steps_per_worker"].values()) == sorted(hogwild["corpus"]["per_process"])
    assert "verdict:" in stderr
    # the parent's test batch is evaluation: apart from the training figures, and the
    # counts add up to the steps recorded (issue 39: 189 steps, "94 + 94")
    parent = hogwild["steps"][hogwild["steps"]["worker"] == 0]
    assert summary["evaluation_steps"] == len(parent)
    assert summary["steps"] == sum(hogwild["corpus"]["per_process"]) + len(parent)
    left = summary["left_out"]
    assert summary["steps"] == (
        len(parent) + left["warmup"] + left["profiled"] + summary["timed_steps"]
    )


@pytest.mark.parametrize("hogwild", ["spawn"], indirect=True)  # the example's own start
def test_one_process_takes_the_capture_and_the_verdict_rests_on_it(hogwild: dict) -> None:
    traces = hogwild["artifacts"]
    assert (traces["kind"] == "trace").sum() == 1, traces
    assert Path(traces["path"].iloc[0]).exists()
    profiled = hogwild["steps"].groupby("worker")["profiled"].sum()
    assert (profiled > 0).sum() == 1, profiled  # one worker's steps, not both
    assert hogwild["show"]["diagnosis"]["level"] == "trace", hogwild["show"]["diagnosis"]


def test_the_step_chart_draws_each_worker_in_its_own_colour(hogwild: dict) -> None:
    # issue 39: workers and ranks were drawn in one colour; the parent's test pass is
    # named as evaluation, not a third series of "timed" steps
    from stepscope.app.dashboard.charts.steps import step_time_chart

    fig = step_time_chart(hogwild["steps"], 5, None)
    timed = {t.name: t.marker.color for t in fig.data if t.name.endswith(" timed")}
    assert len(timed) == 2 and len(set(timed.values())) == 2, timed
    parent = hogwild["steps"]["worker"] == 0
    named = [t.name for t in fig.data if t.name.startswith("evaluation")]
    assert named == (["evaluation (another process)"] if parent.any() else []), named
