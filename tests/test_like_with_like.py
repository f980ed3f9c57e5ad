"""Compare pairs like with like (issue 39, item 4).

* "Compare with…" suggests a run of the same command in the same working folder, or of
  the same script path (resolved against the folder), else none: two examples' ``main.py``
  are two programs, not "(same script)".
* Compare opened on two different programs leads with "these are different programs",
  gives no faster/slower verdict, and lists what differs; "What changed" never reads a
  different script as an edit of one command ("removed --no-accel").
* A moment in the config diff reads as a date and time, not 1795827836.01.
* A run compared with itself, a run without a working folder: one line, the rest shown.

The stores are written directly (runs and their steps): the pairing depends on how runs
relate, not on what a job did; the pages read them through the real store.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dashboard_helpers import no_errors, open_page, texts

from stepscope.app.dashboard import compare_pair, data
from stepscope.store import RunStore

FF = "/ex/forward_forward"
REG = "/ex/regression"


def _run(
    store: RunStore, command: list[str], cwd: str, step_s: float, config: dict | None = None
) -> int:
    """A finished run of ``command`` in ``cwd``: six steps of ``step_s``, batch 8."""
    run_id = store.create_run(command, name="main", cwd=cwd, config=config)
    t0 = time.time()
    store.add_steps(
        run_id,
        [
            {"step": i, "start_s": t0 + i * step_s, "end_s": t0 + (i + 1) * step_s, "batch_size": 8}
            for i in range(6)
        ],
    )
    store.finish_run(run_id, "completed", exit_code=0)
    return run_id


@pytest.fixture
def two_programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """forward-forward and regression: both ``python main.py``, in two folders, one 100x
    slower per step than the other (what read "166.44x faster")."""
    home = tmp_path / "home"
    with RunStore(home) as store:
        ff = _run(store, ["python", "main.py", "--no-accel"], FF, 0.5)
        reg = _run(
            store,
            ["python", "main.py"],
            REG,
            0.005,
            config={"diagnosed": {"level": "trace", "at": 1795827836.01}},
        )
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    return {"home": str(home), "ff": ff, "reg": reg}


def test_compare_with_is_none_for_two_folders_main_py(two_programs: dict) -> None:
    relations = data.run_relations(two_programs["home"])
    assert relations[two_programs["ff"]]["cwd"] == FF
    assert compare_pair.partner(two_programs["ff"], relations) is None
    assert compare_pair.compare_with(two_programs["ff"], relations) is None  # no "(same script)"


def test_compare_with_is_the_same_command_in_the_same_folder() -> None:
    def run(i: int, command: list[str], cwd: str | None) -> dict:
        return {"id": i, "name": "main", "command": command, "cwd": cwd, "started_at": float(i)}

    runs = {
        1: run(1, ["python", "main.py"], FF),
        2: run(2, ["python", "main.py"], REG),  # same command line, another folder
        3: run(3, ["python", f"{FF}/main.py", "--epochs", "2"], "/home/me"),  # same script
        4: run(4, ["python", "main.py"], FF),
    }
    assert compare_pair.compare_with(1, runs) == ("Compare with #4 (same command)", 1, 4)
    del runs[4]
    assert compare_pair.compare_with(1, runs) == ("Compare with #3 (same script)", 1, 3)
    del runs[3]
    assert compare_pair.partner(1, runs) is None and compare_pair.partner(2, runs) is None
    runs[5] = run(5, ["python", "main.py"], None)  # no folder: nothing tells its main.py
    assert compare_pair.partner(5, runs) is None


def test_compare_of_two_programs_gives_no_verdict(two_programs: dict) -> None:
    at = open_page("compare")
    no_errors(at)
    warning = " ".join(w.value for w in at.warning)
    assert "These are different programs" in warning
    assert f"folder: {FF} → {REG}" in warning
    assert "script: /ex/forward_forward/main.py → /ex/regression/main.py" in warning
    assert "arguments: --no-accel → none" in warning
    labels = [m.label for m in at.metric]
    assert "median step A" in labels and "median step B" in labels  # the figures stay
    assert "speed-up B vs A" not in labels and "median step-time ratio" not in labels
    assert not any(m.proto.delta in ("faster", "slower") for m in at.metric)
    shown = texts(at)
    assert "removed: --no-accel" not in shown  # another script is no edit of a command
    assert "**program** (different programs)" in shown
    assert "No operator diff: A and B are different programs" in shown


def test_a_moment_in_the_config_diff_reads_as_a_date(two_programs: dict) -> None:
    at = open_page("compare", a=str(two_programs["ff"]), b=str(two_programs["reg"]))
    no_errors(at)
    frames = [df.value for df in at.dataframe if "setting" in df.value.columns]
    config = next(f for f in frames if "diagnosed › at" in set(f["setting"]))
    row = config[config["setting"] == "diagnosed › at"].iloc[0]
    assert row["B"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1795827836.01))
    assert "1795827836" not in row["B"]


def test_a_run_compared_with_itself_says_so_in_one_line(two_programs: dict) -> None:
    ff = str(two_programs["ff"])
    at = open_page("compare", a=ff, b=ff)
    no_errors(at)
    assert [i.value for i in at.info][:1] == [
        f"A and B are the same run (#{ff}): no comparison to show; pick another run as B. "
        "Below are that run's own figures."
    ]
    labels = [m.label for m in at.metric]
    assert "median step A" in labels and "speed-up B vs A" not in labels


def test_a_run_without_a_folder_says_what_cannot_be_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with RunStore(home) as store:
        old = _run(store, ["python", "/ex/train.py"], FF, 0.02)
        new = _run(store, ["python", "/ex/train.py"], FF, 0.01)
        store.update_run(old, cwd="")  # an imported run that never said where it ran
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("compare", a=str(old), b=str(new))
    no_errors(at)
    assert (
        f"Run #{old} recorded no working folder: whether A and B ran the same script "
        "cannot be told." in texts(at)
    )
    assert "speed-up B vs A" in [m.label for m in at.metric]  # the same absolute script
