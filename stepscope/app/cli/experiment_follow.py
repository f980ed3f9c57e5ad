"""An experiment followed from the terminal: the refusal line, the progress on stderr, the
exit code of each way it can end. Shared by `optimize`, `optimize --sweep` and `demo`,
so that the sweep's module need not import the optimize command's (they were a circle).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from stepscope.app.cli import term
from stepscope.app.cli.exit_codes import EXIT_REFUSED
from stepscope.app.cli.term import esc, say
from stepscope.app.design_text import PHASES
from stepscope.app.ownership import rerun_refusal
from stepscope.optim_runner.experiment.experiment import ExperimentError
from stepscope.store import RunStore

Start = Callable[[RunStore, int, Callable[[dict[str, Any]], None]], dict[str, Any]]


def followed(run_ref: str, verb: str, what: str, start: Start) -> tuple[dict[str, Any] | None, int]:
    """Re-run a run's command as an experiment of any kind (``start``: fixes, a sweep),
    with its progress on stderr: (result, 0), or (None, exit code) after one line that
    says why not (another user's or host's run, a multi-node run, a failing baseline,
    Ctrl-C)."""
    with RunStore() as store:
        run_id = store.resolve_run(run_ref)
        refused = rerun_refusal(store.run(run_id))
        if refused is not None:  # a shared store holds other people's commands
            print(f"stepscope: cannot {verb} run {run_id}: {refused}", file=sys.stderr)
            return None, EXIT_REFUSED
        with ProgressView(term.console(stderr=True), run_id) as view:
            try:
                return start(store, run_id, view.update), 0
            except (ValueError, ExperimentError) as exc:
                view.stop()
                print(f"stepscope: {exc}", file=sys.stderr)
                return None, 1
            except KeyboardInterrupt:
                view.stop()
                print(f"stepscope: {what} interrupted", file=sys.stderr)
                return None, 130


class ProgressView:
    """The experiment's progress callback, drawn for whoever reads ``console``.

    On a terminal, a rich progress bar with the current arm. Anywhere else (a log file,
    CI, ``2>&1 | tee``) rich draws nothing until the end, and a ten-minute experiment
    looks hung: there each trial's start and end is one plain line instead, e.g.
    ``trial 3/12: all #1 ...`` then ``trial 3/12: all #1 ok (run 17, 4.2 s)``.
    """

    def __init__(self, con: Any, run_id: int) -> None:
        self.console = con
        self.run_id = run_id
        self.started: dict[tuple[str, int, str], float] = {}
        self.progress: Any = None
        self.said_hello = False
        if con.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]optimize run {task.fields[run]}[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=con,
                transient=False,
            )
            self.task = self.progress.add_task("starting", total=None, run=run_id)

    def __enter__(self) -> ProgressView:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, state: dict[str, Any]) -> None:
        if state["event"] == "decision":  # between rounds: arms stopped, or the end
            for line in state.get("lines") or []:
                self.console.print(f"[yellow]{esc(line)}[/]")
            if self.progress is not None:
                self.progress.update(self.task, completed=state["done"], total=state["total"])
            return
        if self.progress is None:
            if not self.said_hello:  # at the first trial: a refused experiment says only why
                say(self.console, f"optimize run {self.run_id}: one line per trial run")
                self.said_hello = True
            say(self.console, trial_line(state, self.started))
        if state["event"] == "trial_end" and state.get("error"):
            if state.get("status") == "failed":
                head = f"[red]{esc(state['arm'])} failed[/]"
            else:  # 'not applied': the job ran, its fix did not take effect (not measured)
                head = f"[yellow]{esc(state['arm'])}[/]"
            self.console.print(f"{head} (run {state['run_id']}): {esc(state['error'])}")
        if state["event"] == "trial_end" and state.get("note"):  # a busy trial, run again
            self.console.print(
                f"[yellow]{esc(state['arm'])}[/] (run {state['run_id']}): {esc(state['note'])}"
            )
        if self.progress is not None:
            label = f"{esc(state['arm'])} (trial {state['trial'] + 1}/{state['trials']})"
            if state["phase"] in PHASES:
                label = f"{PHASES[state['phase']]}: {label}"
            self.progress.update(
                self.task, completed=state["done"], total=state["total"], description=label
            )


def trial_line(state: dict[str, Any], started: dict[tuple[str, int, str], float]) -> str:
    """One plain line for a trial's start or end (``started`` keeps the start times)."""
    key = (str(state["arm"]), int(state["trial"]), str(state.get("phase")))
    what = f"{state['arm']} #{int(state['trial']) + 1}"
    total = state.get("total") or "?"
    start = state["event"] == "trial_start"
    if state.get("phase") in PHASES:
        # a phase of its own, counted in its own trials: the main count never runs past
        # its total ("16/16", then "17/20")
        counter = f"{PHASES[state['phase']]}, {what} of {state['trials']}"
    else:
        counter = f"trial {int(state['done']) + start}/{total}: {what}"
    if start:
        started[key] = time.monotonic()
        return f"{counter} ..."
    took = ""
    if key in started:
        took = f", {time.monotonic() - started.pop(key):.1f} s"
    outcome = state.get("status") or "ended"
    return f"{counter} {outcome} (run {state.get('run_id')}{took})"
