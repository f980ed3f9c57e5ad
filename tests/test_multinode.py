"""One run for a multi-node job: its launchers join one run, on SQLite and on PostgreSQL.

A two-node `torchrun` job is simulated on this machine: two `stepscope run -- torchrun
--nnodes 2 --node_rank 0|1 --rdzv-endpoint 127.0.0.1:PORT ...` launchers, started at the
same time against one store, each with a capture. They must end up in one run with two
members (one per launcher), both ranks' steps, both launchers' samplers' rows (with the
host), both ranks' traces, and `stepscope analyze RUN` must analyse both ranks, grouped
by node. Launchers with an explicit `--run-group` (plain Python, fast) check the rest of
the lifecycle: the run ends only with its last launcher, with the worst status; and two
ordinary runs started together stay two runs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dashboard_helpers import ENTRY, REPO, cli_env
from streamlit.testing.v1 import AppTest

from stepscope.collectors.launch.run_group import run_group_of
from stepscope.store import RunStore

TIMEOUT_S = 300


def _launch(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", *args],
        cwd=REPO,
        env=cli_env(home),  # $STEPSCOPE_STORE (store_backend) passes through
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_all(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    """Each launcher's exit code and stderr; on a hang, all are killed and their output
    is the failure's message (a rendezvous that never completes says why there)."""
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=TIMEOUT_S)
            out.append((p.returncode, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        errs = [p.communicate()[1] for p in procs]
        pytest.fail(f"launchers still running after {TIMEOUT_S} s:\n" + "\n---\n".join(errs))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the key ---------------------------------------------------------------------------
def test_the_group_key_from_options_slurm_and_torchrun() -> None:
    torchrun = ["torchrun", "--nnodes", "2", "--node_rank", "1", "--rdzv-endpoint", "h:29400"]
    g = run_group_of([*torchrun, "--rdzv-id", "j1", "train.py", "--nnodes", "9"], {})
    assert (g.key, g.node_rank, g.source) == ("torchrun:h:29400/j1", 1, "torchrun")
    # torchrun's default id is "none": the endpoint keys it; a range of nodes counts
    g = run_group_of(["torchrun", "--nnodes=1:4", "--rdzv_endpoint=h:1", "t.py"], {})
    assert g.key == "torchrun:h:1/none"
    g = run_group_of(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--master_addr", "a"],
        {"PET_NODE_RANK": "1"},
    )
    assert (g.key, g.node_rank) == ("torchrun:a:29500/none", 1)
    # one node, or no torchrun at all: an ordinary run
    assert run_group_of(["torchrun", "--standalone", "--nproc_per_node", "2", "t.py"], {}) is None
    assert run_group_of(["python", "t.py", "--nnodes", "2"], {}) is None
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "3"}
    g = run_group_of(["python", "t.py"], slurm)
    assert (g.key, g.node_rank, g.source) == ("slurm:77.0", 3, "slurm")
    # the option wins over Slurm, which wins over torchrun's rendezvous
    assert run_group_of([*torchrun, "t.py"], slurm, "mine").key == "group:mine"
    assert run_group_of([*torchrun, "t.py"], slurm).key == "slurm:77.0"


# -- the lifecycle, fast ---------------------------------------------------------------
def test_launchers_of_one_group_share_a_run_ended_by_the_last(
    tmp_path: Path, store_backend: str
) -> None:
    home = tmp_path / "home"
    quick = "import sys, time; time.sleep(float(sys.argv[1])); sys.exit(int(sys.argv[2]))"
    procs = [
        _launch(home, "--run-group", "g1", "--", sys.executable, "-c", quick, "0.5", "0"),
        _launch(home, "--run-group", "g1", "--", sys.executable, "-c", quick, "3", "3"),
    ]
    (rc0, err0), (rc1, err1) = _wait_all(procs)
    assert (rc0, rc1) == (0, 3), (err0, err1)
    with RunStore(home) as store:
        runs = store.runs()
        assert len(runs) == 1
        run_id = int(runs["id"].iloc[0])
        members = store.members(run_id)
        run = store.run(run_id)
    assert run["run_group"] == "group:g1"
    assert sorted(members["status"]) == ["completed", "failed"]
    assert sorted(members["exit_code"]) == [0, 3]
    assert set(members["host"]) == {socket.gethostname()}
    # the run was not closed by the first launcher: it ended with the worst status
    assert (run["status"], run["exit_code"]) == ("failed", 3)
    assert run["ended_at"] >= members["ended_at"].max() - 1e-6
    lines = err0 + err1
    assert lines.count("launcher started run") == 1 and lines.count("launcher joined run") == 1
    assert f"of run {run_id} completed; the run ends with its last node" in lines

    # its command is one node's: re-running it alone would wait for the others
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "optimize", str(run_id)],
        cwd=REPO,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2  # a refused action, as every refusal (exit_codes.py)
    assert proc.stderr.strip() == (
        f"stepscope: cannot optimize run {run_id}: a multi-node run (group group:g1): its "
        "command is one node's, and a re-run of it alone would wait for the others; "
        "optimize a single-node run of the job"
    )
    # nor swept: a sweep re-runs the same command
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "optimize", str(run_id), "--sweep", "batch"],
        cwd=REPO,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"stepscope: cannot sweep run {run_id}: a multi-node run")


def test_two_ordinary_runs_stay_two_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    code = "import time; time.sleep(1)"
    results = _wait_all([_launch(home, "--", sys.executable, "-c", code) for _ in range(2)])
    assert [rc for rc, _ in results] == [0, 0], results
    with RunStore(home) as store:
        runs = store.runs()
        assert len(runs) == 2
        assert runs["run_group"].isna().all()
        assert all(store.members(int(i)).empty for i in runs["id"])
    assert all("recording run" in err for _, err in results)


# -- a real two-node torchrun job ------------------------------------------------------
def test_two_torchrun_nodes_record_one_run(
    tmp_path: Path, store_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    port = _free_port()

    def node(rank: int) -> subprocess.Popen[str]:
        return _launch(
            home,
            "--profile-at",
            "1",
            "--profile-steps",
            "1",
            "--sample-interval",
            "0.2",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(rank),
            "--nproc_per_node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "job1",
            # Both nodes run on this host, so both match the endpoint's host name and
            # would race to serve the rendezvous store: say which one does (on real
            # nodes the names differ), and give up in bounded time rather than hang.
            "--rdzv-conf",
            f"is_host={int(rank == 0)},join_timeout=120",
            "examples/corpus/ddp_few_steps.py",
            "--steps",
            "3",
        )

    results = _wait_all([node(0), node(1)])
    assert [rc for rc, _ in results] == [0, 0], results
    joined = "".join(err for _, err in results)
    assert "as node 0" in joined and "as node 1" in joined

    with RunStore(home) as store:
        runs = store.runs()
        assert len(runs) == 1, runs[["id", "name", "status"]]
        run_id = int(runs["id"].iloc[0])
        run = store.run(run_id)
        members = store.members(run_id)
        ranks = store.ranks(run_id)
        steps = store.steps(run_id)
        samples = store.samples(run_id)
        events = store.events(run_id)
        traces = store.artifacts(run_id)
    assert run["status"] == "completed"
    assert run["run_group"] == f"torchrun:127.0.0.1:{port}/job1"
    assert sorted(members["node_rank"]) == [0, 1]
    assert list(members["status"]) == ["completed", "completed"]
    assert set(members["host"]) == {socket.gethostname()}
    assert sorted(ranks["rank"]) == [0, 1] and set(ranks["host"]) == {socket.gethostname()}
    assert steps.groupby("rank")["step"].count().to_dict() == {0: 3, 1: 3}
    # each launcher's sampler wrote into this run, with its host
    assert len(samples) and set(samples["host"]) == {socket.gethostname()}
    samplers = events[events["source"] == "gpu_sampler"]
    assert len(samplers) == 2, events[["source", "message"]]
    traces = traces[traces["kind"] == "trace"]
    assert sorted(traces["rank"]) == [0, 1]
    assert all(Path(p).exists() for p in traces["path"])

    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "analyze", str(run_id), "--json"],
        cwd=REPO,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["run_id"] == run_id
    assert sorted(report["summary"]["ranks"]) == [0, 1]
    by_node = report["ranks_by_node"]
    assert sorted(r["rank"] for r in by_node) == [0, 1]
    assert {r["node"] for r in by_node} == {socket.gethostname()}
    assert all(r["steps"] == 3 and r["vs_fastest"] >= 1.0 for r in by_node)
    assert any(r["vs_fastest"] == pytest.approx(1.0) for r in by_node)
    assert all(r["wait_s"] is not None for r in by_node)  # the trace's collectives

    # the dashboard's run page: the same ranks, by node
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT_S)
    at.run()
    at.query_params["run"] = str(run_id)
    at.switch_page("views/run/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = next(df.value for df in at.dataframe if "node rank" in df.value.columns)
    assert sorted(table["rank"]) == [0, 1] and set(table["node"]) == {socket.gethostname()}
    assert sorted(table["steps"]) == [3, 3]
    # the collectives' whole time beside its wait (issue 39: "0.00 ms/step waiting"
    # beside a diagnosis of 17 % in collectives), and no raw None in any cell
    shown = dict(zip(table["rank"], table["in collectives (ms/step)"], strict=True))
    for r in by_node:
        assert float(shown[r["rank"]]) == pytest.approx(r["comm_s"] * 1e3), (r, shown)
    assert "None" not in set(table.astype(str).to_numpy().ravel().tolist()), table
