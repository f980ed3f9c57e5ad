"""What the CLI prints when its output is read by a program or a log, not a terminal.

Each test runs the `stepscope` command with stdout (and stderr) piped, as
``stepscope runs | cat`` or a CI job would, over a store of real runs where it matters
(tests/jobs/train.py under ``launch_run``) and over experiment results stored by hand
where the point is how a result reads (see ``dashboard_helpers.experiment_result``).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashboard_helpers import (
    APPLIED_CHANGE,
    CONTENTION_WARNING,
    FIX_NOTE,
    NOT_APPLIED_WHY,
    REPO,
    cli_env,
    stepscope,
    stored_experiment,
)

from stepscope.app.cli import main as cli
from stepscope.app.cli import optimize as cli_optimize
from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console
from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
BRACKETED = "nanogpt [baseline #1]"
LONG = "a-run-name-long-enough-that-eighty-columns-cannot-hold-it-beside-the-other-columns"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two real runs of tests/jobs/train.py, one named like an experiment's trial."""
    home = tmp_path_factory.mktemp("cli_output") / "home"
    ids = {}
    for name in (BRACKETED, LONG):
        command = [sys.executable, str(JOBS / "train.py"), "--steps", "6"]
        command += ["--sleep", "0.0", "--batch", "8", "--accum", "1", "--compute", "0"]
        ids[name], code = launch_run(command, name=name, home=home, quiet=True)
        assert code == 0
    with RunStore(home) as s:
        s.log_event(ids[BRACKETED], "warning", "apply", "dataloader_workers: [bold]kept[/bold] 0")
    return {"home": home, "ids": ids}


# -- piped tables -------------------------------------------------------------------------
def test_runs_piped_is_one_line_per_run(store: dict) -> None:
    out = stepscope(store["home"], "runs")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "\x1b[" not in out.stdout  # no colour codes in a pipe
    for name, run_id in store["ids"].items():
        rows = [line for line in out.stdout.splitlines() if re.match(rf"^│\s*{run_id}\s*│", line)]
        assert len(rows) == 1, out.stdout
        cells = [c.strip() for c in rows[0].strip("│").split("│")]
        # id, name, status, exit, steps, median step, started, duration: all on the line
        assert cells[:5] == [str(run_id), name, "completed", "0", "6"], cells
        assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", cells[6]) and cells[7].endswith(" s")
    lines = out.stdout.splitlines()
    assert len([line for line in lines if line.startswith("┃")]) == 1  # the header
    assert len([line for line in lines if line.startswith("│")]) == len(store["ids"])
    assert all(line == line.rstrip() for line in lines)


def test_show_piped_keeps_each_field_on_its_line(store: dict) -> None:
    run_id = store["ids"][BRACKETED]
    out = stepscope(store["home"], "show", str(run_id))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"run {run_id}: {BRACKETED}"  # the title, its label intact
    with RunStore(store["home"]) as s:
        run = s.run(run_id)
    command = " ".join(run["command"])
    assert len(command) > 80  # long enough that 80 columns would have wrapped it
    (row,) = [line for line in lines if "│ command" in line]
    assert command in row
    (folder,) = [line for line in lines if "│ folder" in line]
    assert str(store["home"] / "runs" / str(run_id)) in folder
    (logged,) = [line for line in lines if "│ apply" in line]
    assert "dataloader_workers: [bold]kept[/bold] 0" in logged  # a log line, not markup


def test_labels_are_not_eaten_as_markup(store: dict) -> None:
    runs = stepscope(store["home"], "runs").stdout
    assert BRACKETED in runs
    with RunStore(store["home"]) as s:
        failed = s.create_run(["python", "x.py", "--tag", "[red]"], name="job [v2]")
        s.finish_run(failed, "failed", exit_code=1, error="RuntimeError: [rank0]: boom [/]")
    out = stepscope(store["home"], "show", str(failed))
    assert out.returncode == 0, out.stderr
    assert f"run {failed}: job [v2]" in out.stdout
    assert "python x.py --tag [red]" in out.stdout
    assert "RuntimeError: [rank0]: boom [/]" in out.stdout
    assert re.search(
        rf"│\s*{failed}\s*│ job \[v2\]\s*│ failed", stepscope(store["home"], "runs").stdout
    )


def test_show_lists_what_a_trial_applied(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ids = stored_experiment(home)
    out = stepscope(home, "show", str(ids["trial"]))
    assert out.returncode == 0, out.stderr
    title = f"fixes applied (experiment {ids['experiment']}, arm all, trial 1; "
    assert title + "fixes: dataloader_workers, prefetch_factor)" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("│ dataloader_workers")]
    assert len(rows) == 1 and APPLIED_CHANGE in rows[0] and "applied, verified" in rows[0]
    (skipped,) = [line for line in out.stdout.splitlines() if line.startswith("│ prefetch")]
    assert "not applied: no worker processes [yet]" in skipped and "│ not applied" in skipped
    # a run that is no trial has no such table
    assert "fixes applied" not in stepscope(home, "show", str(ids["baseline"])).stdout


# -- help -------------------------------------------------------------------------------
def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*args, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_help_prints_single_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "optimize")
    assert "%%" not in text
    words = " ".join(text.split())  # argparse wraps lines at the terminal's width
    assert "95 % confidence interval" in words
    assert "--keep-explicit keep values the script set explicitly (num_workers=0" in words
    for verb in ("run", "runs", "show", "capture", "analyze", "attach", "demo", "dashboard"):
        assert "%%" not in _help(capsys, verb), verb
    assert "%%" not in _help(capsys)


# -- optimize: the report and its new fields ----------------------------------------------
def _rendered(result: dict) -> str:
    buf = io.StringIO()
    render(result, console(file=buf))
    return buf.getvalue()


def _row(text: str, first_cell: str, table: int = 0) -> str:
    """The line of the ``table``-th table (0: candidates, 1: per fix) starting with
    ``first_cell``."""
    rows = [line for line in text.splitlines() if re.match(rf"^│ {first_cell}\s*│", line)]
    return rows[table] if len(rows) > 1 else rows[0]


def test_report_shows_not_applied_notes_contention_and_keep_explicit(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ids = stored_experiment(home)
    with RunStore(home) as s:
        result = s.experiment(ids["experiment"])["result"]
    text = _rendered(result)
    assert "fixes override values the script set explicitly" in text

    row = _row(text, "all")  # the candidate, one line: never faster, slower or no change
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[2:] == [
        "not applied",
        "-",
        "-",
        f"not applied: dataloader_workers: {NOT_APPLIED_WHY}",
        "-",  # its guard
        "-",  # its peak memory
    ], cells
    assert _row(text, "prefetch_factor").split("│")[6].strip() == "no measurable change"

    fix_row = _row(text, "dataloader_workers", table=1)
    assert f"not applied: {NOT_APPLIED_WHY}" in fix_row
    assert text.count(NOT_APPLIED_WHY) == 2  # its row in each table, not again as an error
    assert not re.search(r"faster|slower|no measurable", fix_row)
    assert f"  prefetch_factor: {FIX_NOTE}" in text.splitlines()
    # the warning after the candidates' table, before the per-fix one
    lines = text.splitlines()
    at = lines.index(f"warning: {CONTENTION_WARNING}")
    assert at > lines.index(row) and at < lines.index(fix_row)
    assert "No fix measured faster" in text


def test_report_of_an_older_result_renders(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ids = stored_experiment(home, new_fields=False)
    with RunStore(home) as s:
        result = s.experiment(ids["experiment"])["result"]
    text = _rendered(result)
    assert "1.50x" in _row(text, "all") and "faster" in _row(text, "all")
    assert "warning" not in text and "explicitly" not in text and "not applied" not in text


def test_keep_explicit_reaches_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--keep-explicit` is passed to run_experiment (its effect inside the job is the
    runner's, tested with it); the report says which way the trials ran."""
    home = tmp_path / "home"
    ids = stored_experiment(home)
    with RunStore(home) as s:
        stored = s.experiment(ids["experiment"])["result"]
    seen: list[dict] = []

    def fake_run(store, run_id, options, progress=None):  # noqa: ANN001, ANN202
        seen.append({"run": run_id, **options.to_json()})
        return dict(stored, keep_explicit=options.keep_explicit)

    monkeypatch.setattr(cli_optimize, "run_experiment", fake_run)
    base = str(ids["baseline"])
    assert cli.main(["--home", str(home), "optimize", base, "--keep-explicit"]) == 0
    assert "values the script set explicitly were kept (--keep-explicit)" in capsys.readouterr().out
    assert cli.main(["--home", str(home), "optimize", base, "--json", "--stall", "90"]) == 0
    assert json.loads(capsys.readouterr().out)["keep_explicit"] is False
    assert [(s["run"], s["keep_explicit"], s["stall_s"]) for s in seen] == [
        (ids["baseline"], True, None),
        (ids["baseline"], False, 90.0),
    ]


# -- optimize: progress when nobody watches a terminal -------------------------------------
def test_optimize_prints_a_line_per_trial_to_a_pipe(tmp_path: Path) -> None:
    """A real experiment (baseline and one fix, one trial each): stderr says each trial's
    start and end as it happens; stdout stays pure JSON."""
    home = tmp_path / "home"
    command = [
        *(sys.executable, str(JOBS / "plan_effects.py"), "--steps", "40"),
        *("--effect", "fused_optimizer=fast"),
    ]
    run_id, code = launch_run(command, home=home, max_steps=6, quiet=True)
    assert code == 0
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home)),
            *("optimize", str(run_id), "--fixes", "fused_optimizer"),
            *("--steps", "6", "--trials", "1", "--json"),
        ],
        cwd=REPO,
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    arrived: list[tuple[float, str]] = []
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:  # as the lines come, not at the end
        arrived.append((time.monotonic(), line.rstrip("\n")))
    stdout = proc.stdout.read()
    assert proc.wait(timeout=300) == 0, "\n".join(t for _, t in arrived)
    ended = time.monotonic()

    result = json.loads(stdout)  # nothing but the JSON on stdout
    lines = [t for _, t in arrived]
    assert lines[0] == f"optimize run {run_id}: one line per trial run"
    base_run, cand_run = result["baseline"]["runs"][0], result["candidates"][0]["runs"][0]
    assert lines[1] == "trial 1/2: baseline #1 ..."
    assert re.fullmatch(rf"trial 1/2: baseline #1 ok \(run {base_run}, \d+\.\d s\)", lines[2])
    assert lines[3] == "trial 2/2: all #1 ..."
    assert re.fullmatch(rf"trial 2/2: all #1 ok \(run {cand_run}, \d+\.\d s\)", lines[4])
    assert len(lines) == 5
    # the second trial (a Python start and 6 steps) was announced well before the end
    assert arrived[3][0] < ended - 0.5
