"""The notebook API as a notebook uses it: ``import stepscope; r = stepscope.analyze(trace)``.

On a real trace from tests/data and on real runs of tests/jobs/train.py (one with
a profiler capture), each part a DataFrame with exactly its documented columns.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from traces import RANK0, RANK1, RESNET_NW0, trace_path

import stepscope
from stepscope.collectors.launch.launcher import launch_run

JOBS = Path(__file__).resolve().parent / "jobs"
REPO = Path(__file__).resolve().parents[1]

BREAKDOWN = ["rank", "step", "category", "time_ns", "step_ns", "share"]
KERNELS = ["name", "class", "count", "total_ns", "mean_ns", "max_ns", "share"]
OPERATORS = ["name", "count", "self_ns", "total_ns", "mean_self_ns", "share"]
PHASES = ["source", "rank", "step", "phase", "time_s", "share"]
FINDINGS = [
    "class",
    "subtype",
    "title",
    "share",
    "confidence",
    "level",
    "top_fix",
    "predicted_speedup",
]
STEPS = [
    "run_id",
    "rank",
    "step",
    "start_s",
    "end_s",
    "step_time_s",
    "data_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "device_s",
    "batch_size",
    "loss",
    "kind",
    "profiled",
]
RUNS = [
    "id",
    "name",
    "status",
    "exit_code",
    "steps",
    "started_at",
    "ended_at",
    "duration_s",
    "command",
    "error",
    "stop_reason",
    "step_time_median_s",
    "samples_per_s",
    "data_wait_share",
    "top_finding",
]
CATEGORIES = ["Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec"]
CATEGORIES += ["Other"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two real runs of a small job: a plain one, then one with a 2-step profiler capture."""
    home = tmp_path_factory.mktemp("api") / "home"
    command = [sys.executable, str(JOBS / "train.py"), "--steps", "8", "--sleep", "0.001"]
    command += ["--batch", "8", "--accum", "1", "--compute", "0"]
    plain, code = launch_run(command, name="plain", home=home, quiet=True)
    assert code == 0
    profiled, code = launch_run(
        command, name="profiled", home=home, quiet=True, profile_at=3, profile_steps=2
    )
    assert code == 0
    return {"home": home, "plain": plain, "profiled": profiled}


def _columns(df: pd.DataFrame, expected: list[str]) -> None:
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == expected


# -- import stepscope stays cheap --------------------------------------------------------
def test_import_stepscope_imports_nothing_heavy() -> None:
    code = (
        "import stepscope, sys\n"
        "heavy = [m for m in ('pandas', 'numpy', 'torch', 'sqlite3') if m in sys.modules]\n"
        "sub = [m for m in sys.modules if m.startswith('stepscope.')]\n"
        "assert not heavy and not sub, (heavy, sub)\n"
        "assert callable(stepscope.mark_step) and 'pandas' not in sys.modules\n"
        "stepscope.analyze\n"
        "assert 'stepscope.api' in sys.modules and 'pandas' in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert {"analyze", "runs", "run", "compare"} <= set(dir(stepscope))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        stepscope.nothing  # noqa: B018


# -- a trace file ------------------------------------------------------------------------
def test_analyze_a_trace_file() -> None:
    trace = trace_path(RESNET_NW0)
    r = stepscope.analyze(trace)

    assert isinstance(r, stepscope.Report)
    _columns(r.breakdown, BREAKDOWN)
    _columns(r.kernels, KERNELS)
    _columns(r.operators, OPERATORS)
    _columns(r.phases, PHASES)
    _columns(r.findings, FINDINGS)
    _columns(r.steps, STEPS)
    assert r.steps.empty  # a trace file has no recorded steps

    b = r.breakdown
    assert b["step"].nunique() == 6 and len(b) == 6 * len(CATEGORIES)
    assert b["category"].unique().tolist() == CATEGORIES
    per_step = b.groupby("step")["share"].sum()
    assert per_step.to_numpy() == pytest.approx(1.0)
    overall = b.groupby("category", sort=False)[["time_ns", "step_ns"]].sum()
    data_loader = overall.loc["DataLoader", "time_ns"] / overall.loc["DataLoader", "step_ns"]
    assert data_loader == pytest.approx(r.trace_report.breakdown["DataLoader"])
    assert data_loader == pytest.approx(0.3337, abs=0.01)  # as `stepscope analyze --json`

    assert len(r.kernels) == 50 and r.kernels["total_ns"].is_monotonic_decreasing
    assert set(r.kernels["class"]) <= {
        *("gemm_conv", "elementwise", "reduction", "normalization"),
        *("communication", "memcpy", "memset", "other"),
    }
    assert len(r.operators) > 50 and r.operators["self_ns"].is_monotonic_decreasing

    phases = r.phases
    assert set(phases["source"]) == {"trace"}
    assert phases["phase"].unique().tolist() == [
        *("data_wait", "forward", "backward", "optimizer", "communication", "sync", "other")
    ]
    assert phases.groupby("step")["share"].sum().to_numpy() == pytest.approx(1.0)
    # the trace's data wait is the breakdown's DataLoader time (both tb-profiler's rule)
    loading = phases[phases["phase"] == "data_wait"]["time_s"].sum()
    assert loading * 1e9 == pytest.approx(overall.loc["DataLoader", "time_ns"], rel=0.01)

    f = r.findings
    assert f.iloc[0]["class"] == "io" and f.iloc[0]["subtype"] == "input_pipeline"
    assert f.iloc[0]["top_fix"] == "dataloader_workers" and f.iloc[0]["predicted_speedup"] > 1
    assert set(f["level"]) == {"trace"}
    assert [x.key for x in r.diagnosis.findings] == (f["class"] + "/" + f["subtype"]).tolist()

    assert r.summary["trace"]["steps"] == 6 and r.summary["steps"] is None
    text = repr(r)
    assert RESNET_NW0 in text and "top finding: I/O / input_pipeline" in text
    assert "breakdown, kernels, operators, phases, findings" in text


def test_analyze_two_ranks_as_a_list() -> None:
    r = stepscope.analyze([str(trace_path(RANK0)), trace_path(RANK1)])
    assert sorted(r.breakdown["rank"].unique()) == [0, 1]
    assert r.summary["trace"]["ranks"] == [0, 1]
    assert len(r.paths) == 2


# -- bad input: the CLI's one line ------------------------------------------------------------
def _cli_error(path: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "analyze", path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    return res.stderr.strip().removeprefix("stepscope: ")


def test_a_bad_path_gives_the_cli_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pt.trace.json.gz")
    with pytest.raises(stepscope.TraceError) as exc:
        stepscope.analyze(missing)
    assert str(exc.value) == f"{missing}: no such file, folder or run" == _cli_error(missing)

    truncated = tmp_path / "cut.pt.trace.json.gz"
    whole = gzip.decompress(trace_path(RANK0).read_bytes())
    truncated.write_bytes(gzip.compress(whole[: len(whole) // 2]))
    with pytest.raises(stepscope.TraceError) as exc:
        stepscope.analyze(truncated)
    assert str(exc.value).startswith(f"{truncated}: truncated JSON")
    assert "\n" not in str(exc.value) and str(exc.value) == _cli_error(str(truncated))


# -- recorded runs ------------------------------------------------------------------------
def test_runs_and_run(recorded: dict) -> None:
    home = recorded["home"]
    table = stepscope.runs(home)
    _columns(table, RUNS)
    assert table["id"].tolist() == [recorded["profiled"], recorded["plain"]]  # newest first
    assert table["name"].tolist() == ["profiled", "plain"]
    assert set(table["status"]) == {"completed"} and set(table["steps"]) == {8}
    assert (table["step_time_median_s"] > 0).all() and (table["samples_per_s"] > 0).all()
    assert table["top_finding"].isna().all()  # never diagnosed: analyze() does not save

    run = stepscope.run(recorded["plain"], home=home)
    assert isinstance(run, stepscope.Run)
    assert run.id == recorded["plain"] and run.name == "plain" and run.status == "completed"
    assert run.row["command"][1].endswith("train.py")
    _columns(run.steps, STEPS)
    assert len(run.steps) == 8 and (run.steps["batch_size"] == 8).all()
    _columns(run.findings, FINDINGS)
    assert run.findings.empty
    assert run.summary["steps"] == 8
    assert repr(run).startswith(f"stepscope.Run {run.id} 'plain' (completed): 8 steps")
    assert stepscope.run("last", home=home).id == recorded["profiled"]
    with pytest.raises(LookupError, match="no run"):
        stepscope.run(999, home=home)


def test_analyze_a_run_with_a_trace(recorded: dict) -> None:
    home = recorded["home"]
    r = stepscope.analyze(recorded["profiled"], home=home)
    assert r.run_id == recorded["profiled"] and len(r.paths) == 1
    for df, columns in (
        (r.breakdown, BREAKDOWN),
        (r.kernels, KERNELS),
        (r.operators, OPERATORS),
        (r.phases, PHASES),
        (r.findings, FINDINGS),
        (r.steps, STEPS),
    ):
        _columns(df, columns)
    assert r.breakdown["step"].nunique() == 2  # the captured steps
    assert r.kernels.empty and not r.operators.empty  # a CPU job
    assert len(r.steps) == 8 and r.steps["profiled"].sum() >= 2  # the profiler's warm-up too
    assert set(r.phases["source"]) == {"trace", "steps"}
    steps_phases = r.phases[r.phases["source"] == "steps"]
    # the step timer's phases: data wait, forward, backward, optimizer, other
    assert len(steps_phases) == 5 * 8
    loading = steps_phases[steps_phases["phase"] == "data_wait"]["time_s"].to_numpy()
    assert loading == pytest.approx(r.steps["data_wait_s"].to_numpy())
    assert steps_phases.groupby("step")["share"].sum().to_numpy() == pytest.approx(1.0)
    for phase in ("forward", "backward", "optimizer"):
        assert steps_phases[steps_phases["phase"] == phase]["time_s"].sum() > 0, phase
    assert set(r.findings["level"]) <= {"trace"}
    assert r.summary["steps"]["steps"] == 8 and r.summary["trace"]["steps"] == 2
    assert f"stepscope.Report of run {r.run_id}, 1 trace file(s)" in repr(r)

    # the same run by name, by 'last' and as a Run; nothing saved to the store
    assert stepscope.analyze("last", home=home).run_id == r.run_id
    assert stepscope.analyze("profiled", home=home).run_id == r.run_id
    assert stepscope.run(r.run_id, home=home).analyze().paths == r.paths
    assert stepscope.run(r.run_id, home=home).findings.empty


def test_analyze_a_run_without_a_trace(recorded: dict) -> None:
    r = stepscope.run(recorded["plain"], home=recorded["home"]).analyze()
    assert r.trace_report is None and r.paths == []
    for df, columns in ((r.breakdown, BREAKDOWN), (r.kernels, KERNELS), (r.operators, OPERATORS)):
        _columns(df, columns)
        assert df.empty
    assert set(r.phases["source"]) == {"steps"}
    _columns(r.findings, FINDINGS)
    assert r.diagnosis.level == "steps"
    assert set(r.findings["level"]) <= {"steps"}
    assert ", no trace" in repr(r)


def test_compare(recorded: dict) -> None:
    home = recorded["home"]
    c = stepscope.compare(recorded["plain"], recorded["profiled"], home=home)
    assert isinstance(c, stepscope.Comparison)
    assert c.a.id == recorded["plain"] and c.b.id == recorded["profiled"]
    ratios = c.ratios
    assert list(ratios.columns) == ["ratio", "lo", "hi", "confidence", "verdict"] + [
        "n_baseline",
        "n_candidate",
    ]
    assert ratios.index.tolist() == ["throughput", "median_step_time"]  # batch sizes known
    assert (ratios["lo"] <= ratios["ratio"]).all() and (ratios["ratio"] <= ratios["hi"]).all()
    assert set(ratios["verdict"]) <= {"faster", "slower", "no measurable change"}
    assert c.headline is c.speed.throughput and c.problem is None
    # 8 steps each, less 1 warm-up step, less the profiled run's capture window
    assert ratios.loc["throughput", "n_baseline"] == 7
    assert ratios.loc["throughput", "n_candidate"] == 7 - c.b.steps["profiled"].sum()
    assert c.caption.startswith("Throughput: ") and c.caption in repr(c)
    assert all(x > 0 for x in (*c.step_time_median_s, *c.samples_per_s))
    # Run objects work as well as ids
    a = stepscope.run(recorded["plain"], home=home)
    assert stepscope.compare(a, stepscope.run("last", home=home)).b.id == recorded["profiled"]
