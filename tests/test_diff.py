"""`stepscope diff`: where the time went between two runs, operator by operator, with
intervals, on real traces and on real recorded runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import stepscope

from stepscope.analyzers.report.call_shapes import shapes, split_changed
from stepscope.analyzers.report.op_diff import (
    COLUMNS,
    FASTER,
    GONE,
    NEW,
    SAME,
    SLOWER,
    diff_calls,
    phase_calls,
)
from stepscope.analyzers.report.run_diff_ops import diff_runs, diff_traces
from stepscope.optim_runner.check.added_work import added_work, beyond
from stepscope.optim_runner.check.perf_check import NO_SLOWDOWN, _with_added_work, check_runs
from stepscope.optim_runner.check.perf_check import SLOWER as CHECK_SLOWER
from stepscope.store import RunStore
from tests.traces import trace_path

NW0 = trace_path("resnet50_v100_num_workers_0.pt.trace.json.gz")
NW4 = trace_path("resnet50_v100_num_workers_4.pt.trace.json.gz")
TRAIN = Path(__file__).resolve().parent / "jobs" / "train.py"


def test_a_trace_against_itself_changes_nothing() -> None:
    d = diff_traces(NW0, NW0)
    assert list(d.ops.columns) == COLUMNS and len(d.ops) > 100
    assert set(d.ops["status"]) == {SAME} and (d.ops["diff_ns"] == 0).all()
    assert set(d.ops["kind"]) == {"operator", "kernel"}
    assert set(d.categories["status"]) == {SAME}


def test_workers_remove_the_loader_wait_and_the_diff_says_where() -> None:
    """ResNet-50 with 4 DataLoader workers against none (the same job, same V100)."""
    d = diff_traces(NW0, NW4)
    # measured changes first, then the rest, each biggest first
    same = (d.ops["status"] == SAME).to_numpy()
    assert not (np.diff(same.astype(int)) < 0).any()
    for group in (d.ops[~same], d.ops[same]):
        assert (np.diff(group["diff_ns"].abs().to_numpy()) <= 0).all()
    top = d.ops.iloc[0]
    assert top["name"].startswith("enumerate(DataLoader)") and top["status"] == GONE
    loader = d.categories.set_index("name").loc["DataLoader"]
    assert loader["status"] == FASTER and loader["hi_ns"] < 0 < loader["a_ns"]
    # the model's own kernels: the same work, no change claimed for the biggest GEMMs
    kernel = d.ops[d.ops["kind"] == "kernel"]
    assert (kernel["status"] != NEW).sum() > 0
    # an interval is given wherever a change is claimed, and it excludes zero
    claimed = d.ops[d.ops["status"].isin([SLOWER, FASTER])]
    assert len(claimed) and claimed["lo_ns"].notna().all()
    assert ((claimed["lo_ns"] > 0) | (claimed["hi_ns"] < 0)).all()


def test_resampling_steps_when_there_are_enough() -> None:
    """Ten steps a side: a name 30 % slower is flagged over steps, noise is not."""
    rng = np.random.default_rng(1)
    rows_a, rows_b = [], []
    for step in range(10):
        for name, a_ms, b_ms in (("aten::mm", 10, 13), ("aten::add", 5, 5)):
            rows_a.append((0, step, "operator", name, int(rng.normal(a_ms, 0.2) * 1e6)))
            rows_b.append((0, step, "operator", name, int(rng.normal(b_ms, 0.2) * 1e6)))
    cols = ["rank", "step", "kind", "name", "time_ns"]
    a, b = pd.DataFrame(rows_a, columns=cols), pd.DataFrame(rows_b, columns=cols)
    windows = pd.DataFrame({"rank": [0] * 10, "step": range(10)})
    d = diff_calls(a, windows, b, windows, step_ns_a=15e6).set_index("name")
    assert d.loc["aten::mm", "status"] == SLOWER and d.loc["aten::mm", "basis"] == "steps"
    assert 2.5e6 < d.loc["aten::mm", "lo_ns"] < 3e6 < d.loc["aten::mm", "hi_ns"] < 3.5e6
    assert d.loc["aten::add", "status"] == SAME


def test_step_timer_phases_are_calls_of_each_timed_step() -> None:
    steps = pd.DataFrame(
        {
            "rank": [0, 0],
            "start_s": [0.0, 1.0],
            "end_s": [1.0, 2.5],
            "data_wait_s": [0.5, 0.0],
            "forward_s": [0.2, 0.3],
            "backward_s": [0.2, None],
            "optimizer_s": [0.05, 0.05],
        }
    )
    calls, windows = phase_calls(steps)
    assert len(windows) == 2
    per = calls.groupby("name")["time_ns"].sum().to_dict()
    assert per["data wait"] == 500_000_000 and per["forward"] == 500_000_000
    assert per["other"] == 50_000_000 + 1_150_000_000  # what no phase covers


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The same small training job, B with 3 extra 256x256 matmuls per step (real runs,
    each with stepscope's default capture)."""
    home = tmp_path_factory.mktemp("diff") / "home"
    for name, extra in (("plain", "0"), ("extra", "3")):
        job = [sys.executable, str(TRAIN), "--steps", "40", "--compute", extra]
        stepscope(home, "run", "--quiet", "--name", name, "--", *job)
    with RunStore(home) as store:
        return home, store.resolve_run("plain"), store.resolve_run("extra")


def test_an_extra_matmul_is_named_among_the_biggest_changes(two_runs) -> None:
    home, a, b = two_runs
    with RunStore(home) as store:
        d = diff_runs(store, a, b)
    assert d.warnings == [] or all("different commands" in w for w in d.warnings)
    ops = d.ops[d.ops["kind"] == "operator"]
    top = ops.head(3).set_index("name")
    # aten::mm's calls per step changed: its rows are by input shapes, the added ones new
    mm = "aten::mm (256x256, 256x256)"
    assert mm in top.index and top.loc[mm, "status"] in (SLOWER, NEW)
    assert top.loc[mm, "b_calls"] == top.loc[mm, "a_calls"] + 3
    unchanged = ops[~ops["name"].str.startswith("aten::mm")]
    assert not unchanged["name"].str.contains(r" \(", regex=True).any()  # one row per name
    phases = d.categories[d.categories["kind"] == "phase"]
    assert set(phases["name"]) >= {"forward", "backward", "optimizer step"}


def test_check_fails_a_run_that_calls_an_operator_more_often(two_runs) -> None:
    """The added matmuls are more work per step: the check names them, with their
    shapes, whatever the machine's speed did to the step times."""
    home, a, b = two_runs
    with RunStore(home) as store:
        result = check_runs(store, b, a)
        same = check_runs(store, a, a)
    assert result.verdict == CHECK_SLOWER
    work = {w.name: w for w in result.added_work}
    mm = work["aten::mm (256x256, 256x256)"]  # the job's extra matmuls, by their shapes
    assert (mm.kind, mm.extra_calls) == ("operator", 3.0) and 0 < mm.least_ns <= mm.added_ns
    assert "aten::mm (256x256, 256x256) is called 3 more times per step" in mm.describe()
    assert "more work per step" in result.why or any("more work" in n for n in result.notes)
    assert mm.name in {w["name"] for w in result.to_json()["added_work"]}
    assert same.added_work == () and same.verdict != CHECK_SLOWER


def _diff(a: list[tuple], b: list[tuple], windows: int = 2, step_ns: float = 1e7) -> Any:
    """A RunDiff's fields that ``added_work`` reads: calls (name, args, time_ns) of each
    side over ``windows`` steps, split by shapes as ``diff_runs`` splits them."""

    def calls(rows: list[tuple]) -> pd.DataFrame:
        df = pd.DataFrame(rows, columns=["name", "args", "time_ns"])
        return df.assign(kind="operator", rank=0, step=0)

    ca, cb = split_changed(calls(a), windows, calls(b), windows)
    return SimpleNamespace(
        calls_a=ca, calls_b=cb, windows_a=windows, windows_b=windows,
        timed_step_ns_a=step_ns, step_ns_a=2 * step_ns,
    )  # fmt: skip


SMALL, BIG = b"[[[64,384],[384,384]]]", b"[[[160,384],[384,384]]]"


def test_a_name_whose_calls_changed_is_split_by_shapes() -> None:
    a = [("aten::mm", SMALL, 1), ("aten::add_", b"[[[3]]]", 1), ("aten::relu", None, 1)]
    b = [*a, ("aten::mm", BIG, 1), ("aten::relu", None, 1), ("aten::relu", None, 1)]

    def frame(rows: list[tuple]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=["name", "args", "time_ns"]).assign(kind="operator")

    sa, sb = split_changed(frame(a), 1, frame(b), 1)
    assert list(sb["name"]) == [
        "aten::mm (64x384, 384x384)",
        "aten::add_",  # as often as before: one row, whatever its shapes
        "aten::relu",  # changed, but no shapes kept: by name
        "aten::mm (160x384, 384x384)",
        "aten::relu",
        "aten::relu",
    ]
    assert sa["name"].iloc[0] == "aten::mm (64x384, 384x384)"
    assert shapes(b"not json") == "" and shapes(None) == "" and shapes(b"[[[], [2]]]") == "2"


def test_added_work_is_the_new_calls_own_time_not_the_names() -> None:
    # two steps: A calls mm on small inputs twice a step, B also once on big ones; addmm
    # is slower per call in B (the machine can do that) but called as often
    a = [("aten::mm", SMALL, 100_000)] * 4 + [("aten::addmm", None, 50_000)] * 2
    b = [("aten::mm", SMALL, 150_000)] * 4 + [("aten::mm", BIG, 400_000)] * 2
    b += [("aten::addmm", None, 90_000)] * 2 + [("aten::copy_", None, 1_000)] * 2
    work = added_work(_diff(a, b))
    assert [w.name for w in work] == ["aten::mm (160x384, 384x384)", "aten::copy_"]
    big = work[0]
    assert big.extra_calls == 1.0 and big.added_ns == big.least_ns == 400_000
    assert big.step_ns == 1e7 and big.share == pytest.approx(0.04)  # of the timed step
    assert beyond(work, 0.03) == [big] and beyond(work, 0.05) == []


def test_added_work_needs_both_traces_and_a_step() -> None:
    d = _diff([("aten::mm", None, 1)], [("aten::mm", None, 1)] * 3)
    assert [w.name for w in added_work(d)] == ["aten::mm"]  # no shapes: by name
    assert added_work(SimpleNamespace(**{**vars(d), "calls_a": None})) == []
    no_step = SimpleNamespace(**{**vars(d), "timed_step_ns_a": np.nan, "step_ns_a": np.nan})
    assert added_work(no_step) == []


def test_added_work_upgrades_only_a_run_not_measurably_slower() -> None:
    (mm,) = added_work(_diff([], [("aten::mm", BIG, 2e6)] * 2))
    verdict, why, notes = _with_added_work(NO_SLOWDOWN, "throughput 0.97x", [mm], 0.05)
    assert verdict == CHECK_SLOWER and why.startswith("more work per step: aten::mm")
    assert "more than the 5 % allowed (figures: throughput 0.97x)" in why
    assert not notes
    assert _with_added_work("faster", "1.2x", [mm], 0.05)[:2] == ("faster", "1.2x")
    assert _with_added_work(NO_SLOWDOWN, "same", [], 0.05) == (NO_SLOWDOWN, "same", [])


def test_cli_diff_prints_json_and_an_unknown_run_is_one_line_exit_1(two_runs) -> None:
    home, a, b = two_runs
    out = stepscope(home, "diff", str(a), str(b), "--json")
    doc = json.loads(out.stdout)
    assert doc["a"] == f"run {a}" and doc["ops"] and set(doc["ops"][0]) == set(COLUMNS)
    bad = stepscope(home, "diff", str(a), "no-such-run", check=False)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "no-such-run" in bad.stderr
    text = stepscope(home, "diff", str(a), str(b), "--top", "5").stdout
    assert "aten::mm" in text and "measured changes first" in text


def test_api_diff_takes_runs_or_traces(two_runs) -> None:
    import stepscope

    home, a, b = two_runs
    by_run = stepscope.diff(a, "extra", home=home)
    assert by_run.a == f"run {a}" and by_run.b == f"run {b}" and len(by_run.ops)
    by_file = stepscope.diff(NW0, NW4)
    assert by_file.ops.iloc[0]["status"] == GONE
