"""The runs list's figures, kept in the store once a run has ended (run_summaries).

Real runs are recorded once for the module: one stopped at its step limit, one whose code
raises, one killed by a signal, one that trains in two worker processes, an inference
run, and, on copies of the first one's steps, a run whose launcher is gone (lost) and one
still running. Each test gets them on both backends (the PostgreSQL store holds copies of
the same rows). Every figure the list shows must be ``summarize_steps``' own, to the last
bit, whether computed now or read back from the store; a run that changes after its
figures were kept has them computed again; the CLI and the Runs page show those figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from dashboard_helpers import REPO, no_errors, open_page
from recordings import copy_of, failing_run, ib_short

from stepscope.analyzers.steps import run_figures
from stepscope.analyzers.steps.run_figures import LISTED, listed_figures
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.app.cli.main import main
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

# Dies by SIGKILL after its steps reached the store (the writer flushes every second).
KILLED_JOB = """
import os, signal, time
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(12):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
time.sleep(2.5)
os.kill(os.getpid(), signal.SIGKILL)
"""

# Trains in two processes of its own (hogwild-style, fork): two workers' series of steps.
WORKERS_JOB = """
import multiprocessing as mp
import torch

def train(steps):
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=train, args=(12,)) for _ in range(2)]
    for w in workers: w.start()
    for w in workers: w.join()
"""

# The run columns a copy keeps: what decides its figures and whether they are kept.
COPIED = ("status", "exit_code", "error", "stop_reason", "started_at", "ended_at")


def _record(home: Path, name: str, *command: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_STORE"}
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", "--no-profile",
         "--name", name, "--", *command],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    with RunStore(home, url=home / "stepscope.db") as store:
        return store.resolve_run(name)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A step row of pandas (numpy scalars, NaN) as the values and NULLs a store takes."""
    out = {}
    for k, v in row.items():
        v = v.item() if hasattr(v, "item") else v
        out[k] = None if isinstance(v, float) and v != v else v
    return out


def _steps_of(store: RunStore, run_id: int) -> list[dict[str, Any]]:
    return [_plain(r) for r in store.steps(run_id).drop(columns=["run_id"]).to_dict("records")]


def _copy_run(src: RunStore, run_id: int, dst: RunStore, **launcher: Any) -> int:
    """``run_id`` of ``src`` as a new run of ``dst``: its state and its steps."""
    run = src.run(run_id)
    new = dst.create_run(run["command"], name=run["name"], status=run["status"], **launcher)
    dst.update_run(new, **{k: _plain({k: run[k]})[k] for k in COPIED})
    dst.add_steps(new, _steps_of(src, run_id))
    return new


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = ib_short(tmp_path_factory, "figures")
    with RunStore(home, url=home / "stepscope.db") as store:
        ids = {"stopped": store.resolve_run("input-bound")}
    ids["failed"] = failing_run(home)
    job = tmp_path_factory.mktemp("jobs")
    (job / "killed.py").write_text(KILLED_JOB)
    (job / "workers.py").write_text(WORKERS_JOB)
    ids["killed"] = _record(home, "killed", sys.executable, str(job / "killed.py"))
    ids["workers"] = _record(home, "workers", sys.executable, str(job / "workers.py"))
    infer = str(REPO / "tests" / "jobs" / "infer.py")
    ids["inference"] = _record(home, "inference", sys.executable, infer, "--calls", "12")
    with RunStore(home, url=home / "stepscope.db") as store:
        # a launcher whose pid now names another process (lost), and one alive (this test's)
        ids["lost"] = _copy_run(store, ids["stopped"], store, pid=os.getpid(), pid_started_at=1.0)
        ids["running"] = _copy_run(store, ids["stopped"], store, pid=os.getpid())
        for kind in ("lost", "running"):  # the next read finds the lost one's launcher gone
            store.update_run(ids[kind], status="running", ended_at=None, stop_reason=None)
    return {"home": home, "ids": ids}


@pytest.fixture
def runs_home(
    recorded: dict[str, Any],
    store_backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Path, dict[str, int]]:
    """The recorded runs in a store of the test's own on ``store_backend``, and their ids;
    the dashboard's and the CLI's store (``$STEPSCOPE_HOME``)."""
    src_home = recorded["home"]
    if store_backend == "sqlite":
        home, ids = copy_of(src_home, tmp_path_factory, "runs"), dict(recorded["ids"])
    else:
        home, ids = tmp_path_factory.mktemp("pg-runs") / "home", {}
        with RunStore(src_home, url=src_home / "stepscope.db") as src, RunStore(home) as dst:
            for kind, run_id in recorded["ids"].items():  # the lost one found lost in src
                pid = os.getpid() if kind == "running" else None
                ids[kind] = _copy_run(src, run_id, dst, pid=pid)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    return home, ids


def _expected(store: RunStore) -> dict[int, dict[str, Any]]:
    """Each run's LISTED figures as summarize_steps gives them, one run at a time."""
    ids = [int(i) for i in store.run_list()["id"]]
    return {i: {k: summarize_steps(store.steps(i))[k] for k in LISTED} for i in ids}


def test_the_runs_are_the_kinds_the_list_meets(runs_home: tuple[Path, dict[str, int]]) -> None:
    home, ids = runs_home
    with RunStore(home) as store:
        status = dict(zip(store.run_list()["id"], store.run_list()["status"], strict=True))
        assert {kind: status[i] for kind, i in ids.items()} == {
            "stopped": "stopped", "failed": "failed", "killed": "killed", "workers": "completed",
            "inference": "completed", "lost": "lost", "running": "running",
        }  # fmt: skip
        summary = {kind: summarize_steps(store.steps(i)) for kind, i in ids.items()}
    assert summary["workers"]["workers"] == 2
    assert summary["inference"]["latency"] is not None  # forward steps only
    assert summary["killed"]["steps"] >= 1
    assert all(s["step_time_median_s"] is not None for s in summary.values())


def test_kept_figures_are_summarize_steps_own(
    runs_home: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computed at the first listing and read back at the next, every figure is the one
    summarize_steps gives the run's steps, to the last bit; a running run's is never kept.
    The runs are read and kept three at a time (batches, as of thousands of runs)."""
    monkeypatch.setattr(run_figures, "BATCH_RUNS", 3)
    home, ids = runs_home
    with RunStore(home) as store:
        expected = _expected(store)
        assert store.kept_summaries() == {}
        first = listed_figures(store, store.run_list())
        kept = store.kept_summaries()
        second = listed_figures(store, store.run_list())
        all_ids = list(expected)
        together = store.steps_of(all_ids)
        for run_id in all_ids:  # the frames the figures are computed over: steps' own
            pd.testing.assert_frame_equal(together[run_id], store.steps(run_id))
            pd.testing.assert_frame_equal(store.steps_of([run_id])[run_id], store.steps(run_id))
    assert first == expected
    assert second == expected
    assert set(kept) == set(expected) - {ids["running"]}
    assert {k: kept[k].figures for k in kept} == {k: expected[k] for k in kept}


def test_the_list_reads_what_was_kept(runs_home: tuple[Path, dict[str, int]]) -> None:
    """A kept row whose run is as it was is read, not computed again: a figure changed in
    the store shows; kept by another FIGURES_VERSION, it is computed again."""
    home, ids = runs_home
    run_id = ids["stopped"]
    with RunStore(home) as store:
        listed_figures(store, store.run_list())
        store._db.execute(
            "UPDATE run_summaries SET figures=:f WHERE run_id=:id",
            {"f": json.dumps({"step_time_median_s": 7.0, "samples_per_s": None,
                              "data_wait_share": 0.5}), "id": run_id},
        )  # fmt: skip
        read = listed_figures(store, store.run_list())[run_id]
        assert read == {"step_time_median_s": 7.0, "samples_per_s": None, "data_wait_share": 0.5}
        expected = _expected(store)[run_id]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(run_figures, "FIGURES_VERSION", run_figures.FIGURES_VERSION + 1)
            assert listed_figures(store, store.run_list())[run_id] == expected
            assert store.kept_summaries()[run_id].key.version == run_figures.FIGURES_VERSION


def test_a_run_that_changes_after_its_figures_were_kept_gets_new_ones(
    runs_home: tuple[Path, dict[str, int]],
) -> None:
    """Steps that arrive after the run's figures were kept (a late rank's), then another
    end: each time the figures are computed again, over the steps the run has then."""
    home, ids = runs_home
    run_id = ids["stopped"]
    with RunStore(home) as store:
        before = listed_figures(store, store.run_list())[run_id]
        late = [
            {**r, "rank": 1, "end_s": r["start_s"] + 3 * (r["end_s"] - r["start_s"])}
            for r in _steps_of(store, run_id)
        ]  # a slower rank
        store.add_steps(run_id, late)
        after = listed_figures(store, store.run_list())[run_id]
        assert after == _expected(store)[run_id] and after != before
        assert store.kept_summaries()[run_id].key.step_count == len(store.steps(run_id))
        store.finish_run(run_id, "failed", 1)  # ended again: another status, another end
        assert listed_figures(store, store.run_list())[run_id] == after
        assert store.kept_summaries()[run_id].key.status == "failed"


def test_kept_figures_that_are_not_numbers_are_computed_again(
    runs_home: tuple[Path, dict[str, int]],
) -> None:
    """A shared store is anyone's to write: a kept row that is not a mapping of names to
    numbers is never shown, and the figures computed in its place replace it."""
    home, ids = runs_home
    with RunStore(home) as store:
        listed_figures(store, store.run_list())
        expected = _expected(store)
        bad = {
            ids["stopped"]: json.dumps({"step_time_median_s": "$(rm -rf ~)"}),
            ids["failed"]: "not json",
            ids["killed"]: json.dumps([1.0, 2.0]),
            ids["workers"]: json.dumps({"step_time_median_s": True}),
        }
        for run_id, text in bad.items():
            store._db.execute(
                "UPDATE run_summaries SET figures=:f WHERE run_id=:id", {"f": text, "id": run_id}
            )
        assert not set(bad) & set(store.kept_summaries())
        assert listed_figures(store, store.run_list()) == expected
        assert {k: store.kept_summaries()[k].figures for k in bad} == {k: expected[k] for k in bad}


def test_runs_json_and_table(
    runs_home: tuple[Path, dict[str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    """`stepscope runs --json` lists every run with summarize_steps' median, first when
    computed and again when kept; the table shows the newest runs, and says so."""
    home, _ = runs_home
    with RunStore(home) as store:
        expected = _expected(store)
    for _ in range(2):
        assert main(["runs", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert {r["id"]: r["step_time_median_s"] for r in listed} == {
            i: f["step_time_median_s"] for i, f in expected.items()
        }
    assert main(["runs", "--json", "--limit", "2"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == sorted(expected)[::-1][:2]

    def table(*args: str) -> tuple[list[str], str]:
        assert main(["runs", *args]) == 0
        out = capsys.readouterr().out
        return [ln for ln in out.splitlines() if ln.startswith("│")], out

    rows, out = table()
    assert len(rows) == len(expected) and "the newest" not in out
    rows, out = table("--limit", "3")
    assert [int(r.split("│")[1]) for r in rows] == sorted(expected)[::-1][:3]
    assert f"the newest 3 of {len(expected)} runs: --all lists every one" in out
    assert len(table("--limit", "3", "--all")[0]) == len(expected)
    assert main(["runs", "--limit", "0"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["stepscope: --limit must be at least 1, not 0"]


def test_runs_page_shows_summarize_steps_figures(runs_home: tuple[Path, dict[str, int]]) -> None:
    """The Runs page, when it computes the figures and when it reads them back, shows each
    run's median step, samples/s and data-wait share as summarize_steps has them."""
    home, ids = runs_home
    with RunStore(home) as store:
        expected = _expected(store)
    for _ in range(2):  # computed, then kept
        at = open_page("runs")
        no_errors(at)
        table = at.dataframe[0].value
        assert sorted(table["id"]) == sorted(expected)
        for row in table.to_dict("records"):
            want = expected[row["id"]]
            for column, name, scale in (
                ("median step (ms)", "step_time_median_s", 1e3),
                ("samples/s", "samples_per_s", 1.0),
                ("data wait (%)", "data_wait_share", 100.0),
            ):
                shown, value = row[column], want[name]
                if value is None:
                    assert shown == "—", (row["id"], column)
                elif isinstance(shown, str):  # a column with an unknown figure is text
                    assert shown == f"{value * scale:.1f}", (row["id"], column)
                else:
                    assert shown == value * scale, (row["id"], column)
        with RunStore(home) as store:
            assert set(store.kept_summaries()) == set(expected) - {ids["running"]}


def test_figures_version_pins_how_the_figures_are_computed() -> None:
    """Kept figures are those of the FIGURES_VERSION they were computed by: a change to
    how summarize_steps computes a listed figure must raise it (every kept row is then
    computed again), or lists show the old figures. This pins both together: when it
    fails, raise run_figures.FIGURES_VERSION and write the new figures here."""
    rows = []
    for rank in (0, 1):
        t = 100.0 + rank * 0.01
        for s in range(40):
            pause = 0.3 if (rank, s) == (0, 20) else 0.0  # one outlier wait, left out
            took = 0.1 + 0.01 * (s % 3) + 0.002 * rank + pause
            rows.append(
                {"run_id": 1, "rank": rank, "worker": 0, "step": s, "start_s": t,
                 "end_s": t + took, "data_wait_s": pause or 0.01, "device_s": None,
                 "batch_size": 16 if s % 5 == 0 else 32, "loss": 1.0 / (s + 1),
                 "kind": "optimizer", "profiled": int(s in (10, 11)), "forward_s": None,
                 "backward_s": None, "optimizer_s": None}
            )  # fmt: skip
            t += took
    # version 2: a process that only evaluated beside the training ones is left out
    for s in range(3):
        rows.append(
            {**rows[-1], "rank": 2, "step": s, "start_s": 200.0 + s, "end_s": 200.05 + s,
             "batch_size": 1000, "kind": "forward", "profiled": 0}
        )  # fmt: skip
    steps = pd.DataFrame(rows)
    summary = summarize_steps(steps)
    assert (run_figures.FIGURES_VERSION, {k: summary[k] for k in LISTED}) == (
        2,
        {
            "step_time_median_s": 0.10999999999999943,
            "samples_per_s": 507.343946206508,
            "data_wait_share": 0.0904427645788342,
        },
    )
