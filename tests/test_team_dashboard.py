"""A team dashboard, safe by default: a shared store holds other people's runs and commands.

One real input-bound run is recorded, then a copy of its row is made to look recorded by
someone else elsewhere (user ``alice`` on ``gpu-node-3``), as a shared PostgreSQL store
would hold it. Stepscope may show that run but must never execute anything for it: the
Optimize page's Apply and compare and the Run page's Capture are disabled with the
reason, `stepscope optimize` and `stepscope capture` refuse it in one line, while the
user's own run stays actionable. The runs list shows user and host, and filters by
them. The dashboard refuses to listen beyond the loopback address without
--allow-remote (before Streamlit starts), and with --require-login but no [auth] set
up it shows one line and no page.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashboard_helpers import (
    ENTRY,
    REPO,
    cli_env,
    no_errors,
    open_page,
    stepscope,
    texts,
)
from recordings import ib_short
from streamlit.testing.v1 import AppTest

from stepscope.app.cli.dashboard import bind_refusal
from stepscope.app.ownership import refusal, this_host, this_user
from stepscope.store import RunStore

TIMEOUT_S = 120
ALICE = {"user": "alice", "host": "gpu-node-3"}


def _foreign_copy(store: RunStore, run_id: int, *, status: str = "completed") -> int:
    """A run with ``run_id``'s command, steps and findings, recorded by alice elsewhere."""
    base = store.run(run_id)
    other = store.create_run(base["command"], name="alices", cwd=base["cwd"], status=status)
    store.update_run(other, **ALICE)
    steps = store.steps(run_id).drop(columns=["run_id"])
    store.add_steps(other, [_plain(r) for r in steps.to_dict("records")])
    return other


def _plain(row: dict) -> dict:
    """numpy scalars and NaN (pandas) as the plain values and NULLs a store takes."""
    out = {}
    for k, v in row.items():
        v = v.item() if hasattr(v, "item") else v
        out[k] = None if isinstance(v, float) and v != v else v
    return out


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = ib_short(tmp_path_factory, "team")
    with RunStore(home) as store:
        own = store.resolve_run("input-bound")
    with RunStore(home) as store:
        foreign = _foreign_copy(store, own)
        live_foreign = _foreign_copy(store, own, status="running")
    return {"home": home, "own": own, "foreign": foreign, "live_foreign": live_foreign}


@pytest.fixture
def home(team: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(team["home"]))
    return team["home"]


# -- the rule --------------------------------------------------------------------------
def test_refusal_names_who_recorded_it_where(team: dict) -> None:
    with RunStore(team["home"]) as store:
        own = store.run(team["own"])
    assert refusal(own) is None  # recorded here by this user, and signed by their key
    why = refusal(ALICE)
    assert why is not None
    assert why.startswith("recorded by alice on gpu-node-3: stepscope acts only on your own")
    assert refusal({**own, "host": "gpu-node-3"}) is not None
    assert refusal({**own, "user": "alice"}) is not None
    # a row that says it is ours is not ours for saying so: the key signs, not the columns
    assert refusal({"id": own["id"], "user": this_user(), "host": this_host()}) is not None
    assert "not signed" in str(refusal({**own, "signature": None}))
    assert refusal({**own, "user": None}) is not None  # a store from before users


# -- the CLI ---------------------------------------------------------------------------
def test_cli_refuses_to_optimize_or_capture_someone_elses_run(team: dict) -> None:
    home, foreign = team["home"], team["foreign"]
    for verb, extra in (("optimize", ("--steps", "3", "--trials", "1")), ("capture", ())):
        proc = stepscope(home, verb, str(foreign), *extra, check=False, timeout=60)
        assert proc.returncode == 2, proc.stderr  # a refused action, for every command
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"stepscope: cannot {verb} run {foreign}: recorded by alice")
        assert "gpu-node-3" in lines[0]
    with RunStore(home) as store:  # nothing was started for it
        children = store.runs()
    assert not (children["parent_run_id"] == foreign).any()


def test_dashboard_refuses_a_remote_address_without_the_flag(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "dashboard", "--host", "0.0.0.0"],
        cwd=REPO,
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""  # no "dashboard on http://..." line: Streamlit never started
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0" in lines[0]
    assert "--allow-remote" in lines[0]
    assert time.monotonic() - started < 30
    assert bind_refusal("127.0.0.1", False) is None and bind_refusal("::1", False) is None
    assert bind_refusal("0.0.0.0", True) is None


def test_dashboard_with_allow_remote_listens_and_warns(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepscope.app.cli",
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--allow-remote",
        ],
        cwd=REPO,
        env=cli_env(tmp_path / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.3)
        else:
            pytest.fail("the dashboard did not listen")
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "warning: listening on 0.0.0.0" in err and "--require-login" in err
    assert out.startswith("stepscope: dashboard on http://127.0.0.1:")


# -- the pages -------------------------------------------------------------------------
def test_runs_page_shows_and_filters_user_and_host(home: Path, team: dict) -> None:
    at = open_page("runs")
    no_errors(at)
    table = next(df.value for df in at.dataframe if "host" in df.value.columns)
    by_id = table.set_index("id")
    assert by_id.loc[team["foreign"], "user"] == "alice"
    assert by_id.loc[team["foreign"], "host"] == "gpu-node-3"
    assert by_id.loc[team["own"], "host"] == this_host()
    assert {ms.label for ms in at.multiselect} >= {"user", "host", "status"}
    at.multiselect(key="runs_host").set_value(["gpu-node-3"]).run()
    shown = next(df.value for df in at.dataframe if "host" in df.value.columns)
    assert sorted(shown["id"]) == sorted([team["foreign"], team["live_foreign"]])
    at.multiselect(key="runs_host").set_value([]).run()
    at.multiselect(key="runs_user").set_value(["alice"]).run()
    shown = next(df.value for df in at.dataframe if "host" in df.value.columns)
    assert set(shown["user"]) == {"alice"}


def test_apply_and_compare_is_disabled_for_someone_elses_run(home: Path, team: dict) -> None:
    foreign = team["foreign"]
    at = open_page("optimize", run=str(foreign))  # diagnosed on opening: reading is open
    no_errors(at)
    apply = at.button(key="apply")
    assert apply.disabled
    assert "recorded by alice on gpu-node-3" in (apply.help or "")
    assert "Not available: recorded by alice on gpu-node-3" in texts(at)
    # the user's own run, same command and findings: the button is there and enabled
    own = open_page("optimize", run=str(team["own"]))
    assert not own.button(key="apply").disabled


def test_capture_is_disabled_for_someone_elses_running_job(home: Path, team: dict) -> None:
    live = team["live_foreign"]
    at = open_page("run", run=str(live))
    assert not at.exception, [e.value for e in at.exception]
    capture = at.button(key="capture")
    assert capture.disabled and "recorded by alice on gpu-node-3" in (capture.help or "")
    run_dir = home / "runs" / str(live) / "control"
    assert not run_dir.exists() or not any(run_dir.iterdir())  # no request written


def test_require_login_without_auth_setup_shows_one_line_and_no_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEPSCOPE_REQUIRE_LOGIN", "1")
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception
    assert [e.value for e in at.error][0].startswith("This dashboard requires sign-in")
    assert not at.title and not at.button  # the runs page did not run
