"""`stepscope runs`, `show` and `capture`: the JSON contract, its values, and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.app.cli.main import main
from stepscope.collectors.capture.control import capture_request_path
from stepscope.store import RunStore

STEPSCOPE = [sys.executable, "-m", "stepscope.app.cli"]

# 2 epochs x 10 batches of 4 through a DataLoader: 20 optimizer steps.
LOADER_JOB = """
import torch
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
print("trained")
"""

RUNS_KEYS = {"id", "name", "status", "exit_code", "steps", "started_at", "ended_at", "command"}
SHOW_KEYS = {
    "id",
    "name",
    "status",
    "exit_code",
    "error",
    "stop_reason",
    "command",
    "device",
    "steps",
    "step_time_median_s",
    "step_time_p95_s",
    "data_wait_share",
    "samples_per_s",
    "artifacts",
    "warmup_steps",
    "warmup_time_s",
    "samples",
    "events",
}


def _cli_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> object:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real `stepscope run` with a capture window, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("recorded")
    home = tmp / "home"
    job = tmp / "train.py"
    job.write_text(LOADER_JOB)
    out = subprocess.run(
        [*STEPSCOPE, "--home", str(home), "run", "--name", "loader", "--profile-at", "5"]
        + ["--profile-steps", "2", "--sample-interval", "0.2", "--", sys.executable, str(job)],
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "STEPSCOPE_HOME"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "trained\n"
    return home


def _json(home: Path, *args: str) -> object:
    out = subprocess.run(
        [*STEPSCOPE, "--home", str(home), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_runs_json_on_a_recorded_run(recorded: Path) -> None:
    runs = _json(recorded, "runs", "--json")
    assert isinstance(runs, list) and len(runs) == 1
    run = runs[0]
    assert set(run) >= RUNS_KEYS
    assert (run["id"], run["name"], run["status"], run["exit_code"]) == (
        1,
        "loader",
        "completed",
        0,
    )
    assert run["steps"] == 20
    assert run["ended_at"] >= run["started_at"] > 1e9
    assert run["step_time_median_s"] > 0


def test_show_json_on_a_recorded_run(recorded: Path) -> None:
    show = _json(recorded, "show", "loader", "--json")
    assert set(show) >= SHOW_KEYS
    assert (show["id"], show["status"], show["steps"]) == (1, "completed", 20)
    assert show["profiled_steps"] == 4  # 2 captured, and the 2 slow ones right after
    assert show["timed_steps"] == 20 - show["warmup_steps"] - 4
    assert 0 < show["step_time_median_s"] <= show["step_time_p95_s"]
    assert 0 < show["data_wait_share"] < 1  # a DataLoader: some time is spent waiting on it
    # 4 samples per step, so throughput is 4 x the step rate, give or take the spread
    assert show["samples_per_s"] == pytest.approx(4 * show["steps_per_s"], rel=1e-6)
    traces = [p for p in show["artifacts"] if p.endswith(".pt.trace.json.gz")]
    assert len(traces) == 1 and Path(traces[0]).is_file()
    assert show["samples"]["metrics"]["proc.rss_bytes"]["max"] > 0
    assert show["loss_first"] is not None
    assert any(e["source"] == "gpu_sampler" for e in show["events"])
    assert _json(recorded, "show", "1", "--json") == show  # by name or by id: the same run


def test_readable_tables_render(recorded: Path) -> None:
    for verb in (["runs"], ["show", "last"]):
        out = subprocess.run(
            [*STEPSCOPE, "--home", str(recorded), *verb], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert "loader" in out.stdout
        assert out.stderr == ""
    assert "median step time" in out.stdout


def _synthetic_run(status: str = "completed") -> int:
    """A run with exactly known steps: figures can be checked to the digit."""
    durations = [5.0, 1, 1, 1, 1, 9.0, 1, 1, 1, 2.0]  # step 0: warm-up, step 5: profiled
    rows, t = [], 1000.0
    for i, d in enumerate(durations):
        rows.append(
            {
                "step": i,
                "start_s": t,
                "end_s": t + d,
                "data_wait_s": 0.25,
                "batch_size": 32,
                "loss": 2.0 - i / 9,
                "kind": "optimizer",
                "profiled": i == 5,
            }
        )
        t += d
    with RunStore() as store:
        run_id = store.create_run(["python", "train.py"], pid=os.getpid())
        store.add_steps(run_id, rows)
        store.add_samples(run_id, [(1000.0, "proc", "cpu_percent", 50.0)])
        store.add_samples(run_id, [(1001.0, "proc", "cpu_percent", 150.0)])
        store.add_artifact(run_id, "trace", "/x/host_1.123.pt.trace.json.gz")
        if status != "running":
            store.finish_run(run_id, status, 0)
    return run_id


def test_show_json_values(capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _synthetic_run()
    show = _cli_json(["show", str(run_id), "--json"], capsys)
    assert show["steps"] == 10
    assert (show["warmup_steps"], show["warmup_time_s"]) == (1, 5.0)
    assert show["profiled_steps"] == 1
    assert show["timed_steps"] == 8  # 1..9 without the profiled step 5
    assert show["step_time_median_s"] == pytest.approx(1.0)
    assert show["step_time_p95_s"] == pytest.approx(1.65)  # numpy's linear interpolation
    assert show["step_time_mean_s"] == pytest.approx(9 / 8)
    assert show["steps_per_s"] == pytest.approx(8 / 9)
    assert show["data_wait_share"] == pytest.approx(8 * 0.25 / 9)
    assert show["samples_per_s"] == pytest.approx(8 * 32 / 9)
    assert (show["loss_first"], show["loss_last"]) == (pytest.approx(2.0), pytest.approx(1.0))
    assert show["artifacts"] == ["/x/host_1.123.pt.trace.json.gz"]
    cpu = show["samples"]["metrics"]["proc.cpu_percent"]
    assert (cpu["mean"], cpu["max"]) == (100.0, 150.0)

    runs = _cli_json(["runs", "--json"], capsys)
    assert [r["id"] for r in runs] == [run_id]
    assert runs[0]["step_time_median_s"] == pytest.approx(1.0)
    assert runs[0]["steps"] == 10


def test_unknown_run_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command that takes a run: 1 and one line naming what was not found (a
    refused action is 2; a store's own problem is said as such)."""
    _synthetic_run()
    for args in (
        ["show", "no-such-run"],
        ["show", "77", "--json"],
        ["capture", "nope"],
        ["optimize", "nope"],
        ["optimize", "nope", "--sweep", "batch"],
        ["check", "nope", "--against", "last"],
        ["check", "last", "--against", "nope"],
        ["diff", "last", "nope"],
        ["tag", "nope", "base"],
        ["trust", "nope"],
        ["analyze", "nope"],
    ):
        assert main(args) == 1, args
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("stepscope"), (args, lines)
        what = "77" if "77" in args else "no-such-run" if "no-such-run" in args else "nope"
        assert f"'{what}'" in lines[0] or f"{what}: no such file, folder or run" in lines[0]


def test_show_on_an_empty_store_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "last"]) == 1
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_capture_refuses_a_finished_run(capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _synthetic_run("completed")
    assert main(["capture", str(run_id), "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "not running" in err and len(err.splitlines()) == 1
    with RunStore() as store:
        assert not capture_request_path(store.run_dir(run_id)).exists()


def test_capture_on_a_running_run_writes_the_request(capsys: pytest.CaptureFixture[str]) -> None:
    run_id = _synthetic_run("running")  # its "launcher" is this test process: alive
    assert main(["capture", str(run_id), "--steps", "4"]) == 0
    assert f"run {run_id}" in capsys.readouterr().out
    with RunStore() as store:
        request = json.loads(capture_request_path(store.run_dir(run_id)).read_text())
    assert request["steps"] == 4
    assert request["id"]
