"""Untrusted input stays data: a shared store's rows, rewritten as an attacker with write
access to the store would, never make stepscope run, read or signal what it did not put
there itself.

Every attack is replayed on a real run recorded into a real store (SQLite, and the
replays on PostgreSQL too) and rewritten there with plain SQL, the way anyone who can
write the store could: a command swapped for ``sh -c``, a changed folder or variable, a
variable that should never be set (``LD_PRELOAD``), a row left unsigned, a signature
moved from another row or made with another key; artifact rows naming files and objects
outside the run's own places; an experiment row pointing at someone else's process.
Each refusal is one line naming the run, the field and why.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashboard_helpers import REPO, open_page, stepscope, texts
from recordings import JOBS

from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.background import cancel_experiment, start_experiment
from stepscope.optim_runner.experiment.experiment import ExperimentOptions, run_experiment
from stepscope.optim_runner.trials.trials import Arm, ReplayRefused, launch_trial
from stepscope.store import RunStore
from stepscope.store.artifact_paths import ArtifactError
from stepscope.store.artifacts import local_copy
from stepscope.store.signing import replayed_env, signature_refusal
from stepscope.store.user_key import forget_cached_keys

PAUSE = [sys.executable, str(JOBS / "pause.py"), "--steps", "6", "--compute-ms", "1"]
FIX = "fused_optimizer"


def _record(home: Path, name: str = "pause") -> int:
    run_id, code = launch_run(PAUSE, name=name, home=home, quiet=True)
    assert code == 0
    return run_id


def _sql(home: Path, statement: str, **params: object) -> None:
    """What an attacker with write access to the store does: plain SQL on the row."""
    with RunStore(home) as store:
        store._db.execute(statement, params)


@pytest.fixture
def recorded(store_backend: str, tmp_path: Path) -> tuple[Path, int]:
    home = tmp_path / "home"
    return home, _record(home)


# -- nothing in the store executes ---------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "statement", "value"),
    [
        ("command", "UPDATE runs SET command=:v WHERE id=:id", None),
        ("cwd", "UPDATE runs SET cwd=:v WHERE id=:id", "/tmp"),
    ],
)
def test_a_rewritten_row_is_never_run(
    recorded: tuple[Path, int], tmp_path: Path, field: str, statement: str, value: str | None
) -> None:
    home, run_id = recorded
    marker = tmp_path / "pwned"
    attack = json.dumps(["sh", "-c", f"id > {marker}"])
    _sql(home, statement, v=value or attack, id=run_id)

    proc = stepscope(home, "optimize", str(run_id), "--fixes", FIX, "--steps", "3",
                     "--trials", "1", check=False, timeout=60)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"stepscope: cannot optimize run {run_id}: its {field} does not")
    assert f"stepscope trust {run_id}" in lines[0]
    with RunStore(home) as store:
        with pytest.raises(ReplayRefused, match=f"run {run_id}: its {field} does not match"):
            run_experiment(store, run_id, ExperimentOptions(fixes=(FIX,), steps=3, trials=1))
        with pytest.raises(ReplayRefused):
            launch_trial(store, 0, store.run(run_id), Arm("baseline", "baseline", []), 0,
                         "main", {"steps": 3, "seed": 0}, timeout_s=30)  # fmt: skip
        assert store.experiments(run_id) == []  # no experiment row was even created
        assert len(store.runs()) == 1  # and no trial run
    with pytest.raises(ReplayRefused):
        start_experiment(home, run_id, ExperimentOptions(fixes=(FIX,), steps=3, trials=1))
    assert not marker.exists()


def test_the_optimize_page_refuses_a_rewritten_command(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    _sql(home, "UPDATE runs SET command=:v WHERE id=:id", v='["sh", "-c", "id"]', id=run_id)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("optimize", run=str(run_id))
    assert not at.exception, [e.value for e in at.exception]
    apply = at.button(key="apply")
    assert apply.disabled and "its command does not match its signature" in (apply.help or "")


def test_variables_outside_the_allow_list_never_reach_a_trial(recorded: tuple[Path, int]) -> None:
    """LD_PRELOAD (and a plug-in list stepscope would import) written into the recorded
    variables: not signed, not replayed. The trial's own output says so: the dynamic
    loader would have complained about a library it cannot preload."""
    home, run_id = recorded
    with RunStore(home) as store:
        env = store.run(run_id)["env"]
    env["vars"].update({"LD_PRELOAD": "/nonexistent/evil.so", "STEPSCOPE_FIX_MODULES": "evil"})
    _sql(home, "UPDATE runs SET env=:v WHERE id=:id", v=json.dumps(env), id=run_id)
    with RunStore(home) as store:
        base = store.run(run_id)
        assert signature_refusal(base) is None  # the signed variables did not change
        assert not {"LD_PRELOAD", "STEPSCOPE_FIX_MODULES"} & set(replayed_env(base))
        trial = launch_trial(store, 0, base, Arm("baseline", "baseline", []), 0, "main",
                             {"steps": 3, "seed": 0}, timeout_s=120)  # fmt: skip
        assert store.run(trial)["status"] in ("completed", "stopped")
    output = (home / "runs" / str(trial) / "output.log").read_text()
    assert "evil" not in output and "ld.so" not in output


def test_a_changed_replayed_variable_is_named(recorded: tuple[Path, int]) -> None:
    home, run_id = recorded
    with RunStore(home) as store:
        env = store.run(run_id)["env"]
    env["vars"]["OMP_NUM_THREADS"] = "64"
    _sql(home, "UPDATE runs SET env=:v WHERE id=:id", v=json.dumps(env), id=run_id)
    with RunStore(home) as store:
        why = signature_refusal(store.run(run_id))
    assert why is not None and why.startswith("its env does not match its signature")


def test_a_signature_moved_or_made_with_another_key_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    first, second = _record(home), _record(home)
    with RunStore(home) as store:
        signature = store.run(first)["signature"]
    _sql(home, "UPDATE runs SET signature=:v WHERE id=:id", v=signature, id=second)
    with RunStore(home) as store:  # the same command, folder and user: the id is signed too
        assert signature_refusal(store.run(second)).startswith("its command does not match")

    monkeypatch.setenv("STEPSCOPE_KEY", str(tmp_path / "mallory" / "key"))
    theirs = _record(home, "mallory")
    monkeypatch.undo()
    with RunStore(home) as store:
        why = signature_refusal(store.run(theirs))
    assert why is not None and why.startswith("signed with another key (")

    loose = tmp_path / "loose" / "key"
    loose.parent.mkdir()
    loose.write_text(Path(os.environ["STEPSCOPE_KEY"]).read_text())
    loose.chmod(0o644)
    monkeypatch.setenv("STEPSCOPE_KEY", str(loose))
    forget_cached_keys()
    with RunStore(home) as store:
        why = signature_refusal(store.run(first))
    assert why is not None and "readable by others (mode 644)" in why


# -- stepscope trust ----------------------------------------------------------------------------
def _in_a_terminal(args: list[str], answer: str, home: Path) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal for its input and output; answer its prompt."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args],
        stdin=follower, stdout=follower, stderr=follower, cwd=REPO, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    out = b""
    answered = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            out += chunk
        if not answered and b"[y/N]" in out:
            os.write(leader, answer.encode() + b"\n")
            answered = True
        if proc.poll() is not None and not ready:
            break
    os.close(leader)
    return proc.wait(timeout=30), out.decode(errors="replace")


def test_an_unsigned_run_is_refused_until_its_owner_trusts_it_at_a_terminal(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    _sql(home, "UPDATE runs SET signature=NULL WHERE id=:id", id=run_id)  # before this change
    proc = stepscope(home, "optimize", str(run_id), "--fixes", FIX, check=False, timeout=60)
    assert proc.returncode == 2
    assert f"cannot optimize run {run_id}: not signed" in proc.stderr

    piped = stepscope(home, "trust", str(run_id), check=False, timeout=60)  # no terminal
    assert piped.returncode == 2
    assert piped.stderr.strip() == (
        f"stepscope: cannot trust run {run_id}: signing needs you at a terminal to confirm it"
    )
    code, out = _in_a_terminal(["trust", str(run_id)], "n", home)
    assert code == 1 and f"run {run_id} not signed" in out
    code, out = _in_a_terminal(["trust", str(run_id)], "y", home)
    assert code == 0, out
    assert "pause.py --steps 6" in out and "folder" in out  # what it signs, shown first
    with RunStore(home) as store:
        assert signature_refusal(store.run(run_id)) is None
    again = stepscope(home, "trust", str(run_id), timeout=60)
    assert "is signed as it stands" in again.stdout

    _sql(home, "UPDATE runs SET \"user\"='alice' WHERE id=:id", id=run_id)
    code, out = _in_a_terminal(["trust", str(run_id)], "y", home)
    assert code == 2 and "recorded by alice" in out and "only its owner" in out
    missing = stepscope(home, "trust", "999", check=False, timeout=60)
    assert missing.returncode == 1 and "no run" in missing.stderr


# -- files only from where stepscope writes them --------------------------------------------------
def test_artifact_rows_cannot_name_files_outside_the_runs_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    run_dir = home / "runs" / str(run_id)
    (run_dir / "link.pt.trace.json").symlink_to("/etc/passwd")
    outside = [
        "/etc/passwd",
        f"{run_dir}/../../../../../../etc/passwd",
        str(run_dir / "link.pt.trace.json"),
        str(home / "runs" / str(run_id + 1) / "other.json"),  # another run's folder
    ]
    for path in outside:
        with pytest.raises(ArtifactError, match=f"run {run_id}: artifact .* lies outside"):
            local_copy(path, home, run_id=run_id)
    # a local copy named in the row's meta is checked the same way
    with pytest.raises(ArtifactError, match="no s3:// artifact location"):
        local_copy("s3://bucket/runs/1/t.json", home, "/etc/passwd", run_id=run_id)
    monkeypatch.setenv("STEPSCOPE_ARTIFACTS", "s3://team-bucket/traces")
    for uri in ("s3://other-bucket/traces/runs/1/t.json", "s3://team-bucket/traces/runs/2/t.json",
                "s3://team-bucket/traces/runs/1/../2/t.json"):  # fmt: skip
        with pytest.raises(ArtifactError, match="lies outside s3://team-bucket/traces/runs/1/"):
            local_copy(uri, home, run_id=1)
    monkeypatch.delenv("STEPSCOPE_ARTIFACTS")

    with RunStore(home) as store:
        for path in outside:
            store.add_artifact(run_id, "trace", path)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    assert not at.exception, [e.value for e in at.exception]
    assert not at.get("download_button")  # nothing served
    warnings = [w.value for w in at.warning] + [e.value for e in at.error]
    assert any("/etc/passwd lies outside" in w for w in warnings), warnings
    assert "root:" not in texts(at)
    proc = stepscope(home, "analyze", str(run_id), check=False, timeout=60)
    assert proc.returncode != 0 and "root:" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "lies outside" in proc.stderr


def test_a_moved_home_still_finds_its_runs_files(tmp_path: Path) -> None:
    """Rows keep absolute paths; a home copied elsewhere reads its own copy of them."""
    home = tmp_path / "old"
    run_id = _record(home)
    recorded = home / "runs" / str(run_id) / "note.txt"
    recorded.write_text("kept")
    moved = tmp_path / "new"
    home.rename(moved)
    found = local_copy(str(recorded), moved, run_id=run_id)
    assert found == (moved / "runs" / str(run_id) / "note.txt").resolve()
    assert found.read_text() == "kept"


# -- signals only to processes stepscope started ----------------------------------------------------
def test_an_experiment_row_cannot_aim_cancel_at_another_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        import psutil

        started = psutil.Process(victim.pid).create_time()
        with RunStore(home) as store:
            for pid_started_at in (None, started):  # no start time; the right one
                experiment = store.create_experiment(
                    run_id, {}, pid=victim.pid, pid_started_at=pid_started_at
                )
                assert cancel_experiment(store, experiment) is False
        time.sleep(0.3)
        assert victim.poll() is None  # it was not stepscope's: never signalled
    finally:
        victim.kill()
        victim.wait()


# -- stored text stays text ------------------------------------------------------------------
IMAGE = "![x](http://attacker.example/pixel.png)"


@pytest.mark.parametrize("generation", [False, True])
def test_a_sweep_result_shows_no_markdown_image_or_link(generation: bool) -> None:
    """A sweep's stored result is shown as text: a markdown image in it (the page would
    fetch an outside address on every visit) comes out with its brackets escaped."""
    from dashboard_helpers import sweep_page
    from streamlit.testing.v1 import AppTest

    row = {"factor": 1, "batch_size": 4, "status": "completed", "samples_per_s": 10.0,
           "p50_s": 0.01, "p99_s": 0.01}  # fmt: skip
    knee = {"batch_size": 4, "factor": 1, "why": IMAGE, "p99_s": 0.01}
    largest = {"batch_size": 4, "limit_bytes": 2**30, "smallest_out_of_memory": 8,
               "limit_source": IMAGE, "peak_key": "vm_peak_bytes"}  # fmt: skip
    result = {"rows": [row], "knee": knee, "trials": 1, "steps": 2, "largest_batch": largest}
    at = AppTest.from_function(sweep_page, args=({"id": 1, "result": result}, generation))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [s.value for s in at.success] + [i.value for i in at.info]
    assert any("attacker.example" in s for s in shown), shown
    assert not [s for s in shown if re.search(r"(?<!\\)[\[\]]", s)], shown  # each one escaped


# -- a dashboard others can reach: who comes in, and what they may do ----------------------------------
AUTH = {
    "auth": {
        "redirect_uri": "http://127.0.0.1:8501/oauth2callback",
        "cookie_secret": "a-test-secret-of-some-length",
        "client_id": "stepscope-tests",
        "client_secret": "not-a-real-one",
        "server_metadata_url": "https://accounts.example.com/.well-known/openid-configuration",
    }
}


@pytest.fixture
def remote_bound():
    """The pages run as `stepscope dashboard --host 0.0.0.0 --allow-remote` runs them."""
    from streamlit import config

    config.set_option("server.address", "0.0.0.0")
    yield
    config.set_option("server.address", "127.0.0.1")


def _page(page: str, user: dict | None = None, **params: str):
    from dashboard_helpers import ENTRY
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ENTRY), default_timeout=120)
    at.secrets.update(AUTH)
    if user is not None:
        at.user = user
    at.run()
    if page != "runs" and not at.exception and not at.error:
        at.query_params.update(params)
        at.switch_page(f"views/{page}/page.py").run()
    return at


def test_a_remote_dashboard_offers_no_action_without_sign_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote_bound: None
) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = _page("optimize", run=str(run_id))
    assert not at.exception, [e.value for e in at.exception]
    apply = at.button(key="apply")
    assert apply.disabled and "actions are off" in (apply.help or "")
    assert "--allow-actions --require-login" in texts(at)
    secret = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "--hf-token", "hf_s3cr3t"]
    )
    try:
        at = _page("attach")
        assert not at.exception
        assert "processes of this host are listed on a dashboard bound to this machine" in texts(at)
        assert not at.dataframe and "hf_s3cr3t" not in texts(at)
        # allowed actions need sign-in too: the variable alone opens nothing
        monkeypatch.setenv("STEPSCOPE_ALLOW_ACTIONS", "1")
        assert _page("optimize", run=str(run_id)).button(key="apply").disabled
    finally:
        secret.kill()
        secret.wait()


def test_sign_in_lets_in_only_the_allowed_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remote_bound: None
) -> None:
    home = tmp_path / "home"
    run_id = _record(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.setenv("STEPSCOPE_REQUIRE_LOGIN", "1")
    monkeypatch.setenv("STEPSCOPE_ALLOW_USERS", "ana@team.example,@ml.example")
    monkeypatch.setenv("STEPSCOPE_ALLOW_ACTIONS", "1")
    stranger = {"email": "eve@gmail.com", "is_logged_in": True, "email_verified": True}
    at = _page("runs", user=stranger)
    assert not at.exception
    assert [e.value for e in at.error] == [
        "Signed in as eve@gmail.com, who is not among this dashboard's users (--allow-users)."
    ]
    assert not at.dataframe  # no page ran
    unverified = {"email": "bob@ml.example", "is_logged_in": True, "email_verified": False}
    assert _page("runs", user=unverified).error
    secret = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "--hf-token", "hf_s3cr3t"]
    )
    try:
        for who in ("ana@team.example", "Bob@ML.example"):
            user = {"email": who, "is_logged_in": True, "email_verified": True}
            at = _page("optimize", user=user, run=str(run_id))
            assert not at.exception, [e.value for e in at.exception]
            assert not at.button(key="apply").disabled  # signed in, allowed, actions on
        at = _page("attach", user=user)
        table = next(df.value for df in at.dataframe if "command" in df.value.columns)
        mine = table[table["pid"] == secret.pid]
        assert mine["command"].iloc[0].endswith("--hf-token ***")
    finally:
        secret.kill()
        secret.wait()


def test_the_cli_refuses_unsafe_dashboard_settings(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cases = [
        (("--host", "0.0.0.0", "--allow-remote", "--allow-actions"), "--allow-actions needs"),
        (("--require-login",), "--require-login needs --allow-users"),
        (("--allow-users", "a@b.example"), "--allow-users needs --require-login"),
        (("--require-login", "--allow-users", "nobody"), "'nobody' is not an e-mail"),
    ]
    for verb in ("dashboard", "demo"):
        for args, words in cases:
            proc = stepscope(home, verb, *args, check=False, timeout=60)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (verb, args, proc.stderr)
            assert words in lines[0] and proc.stdout == "", (verb, args)
    assert not (home / "stepscope.db").exists()  # the demo refused before recording anything


def test_allowed_accounts_and_masked_arguments() -> None:
    from stepscope.app.dashboard.sign_in import allowed
    from stepscope.collectors.attach.secret_args import masked

    allow = ["ana@team.example", "@ml.example"]
    assert allowed("ana@team.example", True, allow) and allowed("x@ML.example", None, allow)
    assert not allowed("ana@team.example.evil", True, allow)
    assert not allowed("x@ml.example", False, allow)  # the provider says: not verified
    assert not allowed(None, True, allow) and allowed("anyone@any.where", True, ["*"])
    assert not allowed("eve@sub.ml.example", True, allow)
    argv = ["python", "train.py", "--hf-token", "hf_x", "--password=pw", "--max-new-tokens",
            "50", "WANDB_API_KEY=k", "--db", "postgresql://u:p%2F@h/db", "--tokenizer", "gpt2"]  # fmt: skip
    assert masked(argv) == ["python", "train.py", "--hf-token", "***", "--password=***",
                            "--max-new-tokens", "50", "WANDB_API_KEY=***", "--db",
                            "postgresql://u:***@h/db", "--tokenizer", "gpt2"]  # fmt: skip


@pytest.mark.slow
def test_a_remote_dashboard_in_chromium_has_its_actions_off(tmp_path: Path) -> None:
    """`stepscope dashboard --host 0.0.0.0 --allow-remote`, as a visitor's browser sees it:
    the user's own signed run, and still no button that starts anything."""
    from browser import CHROMIUM, CHROMIUM_ARGS, LOAD_TIMEOUT_MS, require_browser, served

    require_browser()
    from playwright.sync_api import expect, sync_playwright

    home = tmp_path / "home"
    run_id = _record(home)
    options = ("--host", "0.0.0.0", "--allow-remote")
    with served(home, tmp_path / "dashboard.log", *options) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            page.goto(f"{url}optimize?run={run_id}")
            expect(page.get_by_role("heading", name=f"Optimize run {run_id}")).to_be_visible()
            expect(page.get_by_role("button", name="Apply and compare")).to_be_disabled()
            expect(page.get_by_text("actions are off on a dashboard that listens")).to_be_visible()
            page.goto(f"{url}attach")
            expect(page.get_by_text("processes of this host are listed")).to_be_visible()
            expect(page.get_by_role("button", name="Refresh")).to_have_count(0)
            page.screenshot(path=str(tmp_path / "remote-attach.png"), full_page=True)
        finally:
            browser.close()
    log = (tmp_path / "dashboard.log").read_text()
    assert "warning: listening on 0.0.0.0" in log and "actions are off" in log


def test_a_key_that_cannot_be_had_leaves_the_job_recorded_and_unsigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never break the job: without a usable key it runs and is recorded, unsigned, and
    its log says why; only its replay is refused."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("STEPSCOPE_KEY", str(tmp_path / "a-file" / "key"))  # not a folder
    home = tmp_path / "home"
    run_id = _record(home)
    monkeypatch.undo()
    with RunStore(home) as store:
        run = store.run(run_id)
        events = store.events(run_id)
        assert run["status"] == "completed" and store.step_count(run_id)[0] == 6
    assert run["signature"] is None
    assert events["message"].str.startswith("run not signed: ").any()
    assert signature_refusal(run).startswith("not signed")
