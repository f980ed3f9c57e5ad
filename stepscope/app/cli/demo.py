"""`stepscope demo`: the whole loop on a real job, then the dashboard on it.

A new user's first screen should show what the tool is for, not an empty table: so
the demo records the input-bound example (with a profiler capture), diagnoses it, runs
an apply-and-compare experiment on the fixes the diagnosis recommends, and opens the
dashboard on that experiment. Everything is real and goes into its own store (default
``~/.stepscope-demo``), which is emptied first so the demo always shows one clean loop;
a folder that is not a demo store is never emptied.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import stepscope
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.app.cli.dashboard import Access, cmd_dashboard, dashboard_url
from stepscope.app.cli.experiment_follow import ProgressView
from stepscope.app.cli.optimize import render
from stepscope.app.cli.term import console as make_console
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.experiment.experiment import (
    ExperimentError,
    ExperimentOptions,
    run_experiment,
)
from stepscope.optim_runner.verdict.arm_changes import explain_result
from stepscope.store import RunStore

MARKER = ".stepscope-demo"
DEFAULT_HOME = Path.home() / ".stepscope-demo"


class DemoError(RuntimeError):
    """The demo cannot run here (one line)."""


def example_script() -> Path:
    """examples/input_bound.py of the checkout this stepscope runs from, or of the
    current folder (a non-editable install, e.g. the Docker image's /opt/stepscope)."""
    candidates = [
        Path(stepscope.__file__).resolve().parents[1] / "examples" / "input_bound.py",
        Path.cwd() / "examples" / "input_bound.py",
    ]
    for path in candidates:
        if path.exists():
            return path
    raise DemoError(
        f"{candidates[0]} not found: the demo runs the examples of a source checkout "
        "(git clone, then pip install -e .; or run it from the checkout's folder)"
    )


def fresh_home(home: Path) -> Path:
    """An empty store folder: created, or emptied if a previous demo made it."""
    home = home.expanduser()
    if home.exists() and any(home.iterdir()):
        if not (home / MARKER).exists():
            raise DemoError(
                f"{home} is not empty and was not made by `stepscope demo`: "
                "pick another --home (the demo starts from an empty store)"
            )
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).write_text("made by `stepscope demo`; emptied by the next demo\n")
    return home


def run_demo(home: Path, steps: int, trials: int, console: Any) -> tuple[int, int]:
    """Record, diagnose, optimize; returns (baseline run id, experiment id)."""
    script = example_script()
    console.print(
        f"[bold]1/3[/] recording {esc(script.name)} ({steps} steps, a profiler capture of "
        "3 steps), about 15 s"
    )
    with console.status("the job is running (its output: the run's job.log)"):
        run_id, code = launch_run(
            [sys.executable, str(script), "--steps", str(steps)],
            name="input-bound",
            profile_at=5,
            profile_steps=3,
            home=home,
            cwd=script.parents[1],
            output_path="job.log",
            quiet=True,
        )
    if code != 0:
        raise DemoError(f"the example job failed (exit {code}); see {home}/runs/{run_id}/job.log")

    with RunStore(home) as store:
        diagnosis = diagnose_run(store, run_id)
        console.print(f"[bold]2/3[/] diagnosis ({diagnosis.level} level):")
        for f in diagnosis.findings[:3]:
            share = "" if f.share is None else f" {fmt_pct(f.share, 0)} of step time,"
            best = f.fixes[0] if f.fixes else None
            tip = f" → {esc(best.id)} (≤ {best.predicted_speedup}x)" if best else ""
            console.print(
                f"     {esc(f.label)} / {esc(f.subtype)}:{share} confidence {f.confidence:.2f}{tip}"
            )
        console.print(
            f"[bold]3/3[/] apply and compare: baseline and candidates interleaved, "
            f"{trials} trials each"
        )
        with ProgressView(console, run_id) as view:
            result = run_experiment(
                store, run_id, ExperimentOptions(steps=steps, trials=trials), view.update
            )
        render(result, console, changes=explain_result(store, result))
    return run_id, int(result["experiment_id"])


def cmd_demo(
    home: str | None,
    access: Access,
    port: int,
    steps: int,
    trials: int,
    dashboard: bool,
) -> int:
    console = make_console()
    try:
        root = fresh_home(Path(home) if home else DEFAULT_HOME)
        os.environ["STEPSCOPE_HOME"] = str(root)
        run_id, experiment_id = run_demo(root, steps, trials, console)
    except (DemoError, ExperimentError, ValueError) as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stepscope: demo interrupted; what was recorded stays in the store", file=sys.stderr)
        return 130
    if not dashboard:
        console.print(
            f"store: {esc(root)} — `stepscope --home {esc(root)} dashboard` to look at it"
        )
        return 0
    base = dashboard_url(access.host, port).rstrip("/")
    console.print(
        f"[bold]open[/] {esc(base)}/optimize?run={run_id}&experiment={experiment_id} "
        f"(the experiment), or {base}/run?run={run_id} (the run and its diagnosis)"
    )
    return cmd_dashboard(access, port)
