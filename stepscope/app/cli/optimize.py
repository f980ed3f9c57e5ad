"""`stepscope optimize RUN`: re-run a recorded job with fixes applied and prove the gain.

A thin shell over ``optim_runner.experiment.run_experiment``. Progress goes to stderr
(a rich progress bar with the current arm on a terminal, one plain line per trial
start and end anywhere else), so that ``--json`` leaves stdout to the JSON alone; the
report is a table per candidate (with the operators and phases each changed most
against the baseline, ``optim_runner/arm_changes.py``) and predicted vs measured per fix.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from stepscope.app.applied import not_applied_text
from stepscope.app.cli import term
from stepscope.app.cli.term import esc, say
from stepscope.app.design_text import (
    design_line,
    repeat_line,
    stopped_lines,
    stopped_status,
    trials_phrase,
)
from stepscope.app.formats import fmt_ci, fmt_ratio, guard_word, guarded
from stepscope.app.ownership import rerun_refusal
from stepscope.optim_runner.arm_changes import explain_result
from stepscope.optim_runner.experiment import ExperimentError, run_experiment
from stepscope.optim_runner.stacked import over_text
from stepscope.optim_runner.verdict import NOT_RUN
from stepscope.store import RunStore


def cmd_optimize(
    run_ref: str,
    fixes: str | None = None,
    steps: int = 30,
    trials: int = 3,
    timeout: float | None = None,
    allow_numerics: bool = False,
    as_json: bool = False,
    keep_explicit: bool = False,
    output_tolerance: float | None = None,
    min_agreement: float | None = None,
    sweep: str | None = None,
    batch_factors: str | None = None,
    draft_model: str | None = None,
    budget: float | None = None,
    full: bool = False,
    stall: float | None = None,
) -> int:
    if sweep is not None:
        # local: the sweep's module is for --sweep only
        from stepscope.app.cli.sweep import cmd_sweep

        return cmd_sweep(run_ref, batch_factors, steps, trials, timeout, as_json)
    fix_ids = [f.strip() for f in fixes.split(",") if f.strip()] if fixes else None
    result, code = followed(
        run_ref,
        "optimize",
        "experiment",
        lambda store, run_id, progress: run_experiment(
            store,
            run_id,
            fixes=fix_ids,
            steps=steps,
            trials=trials,
            timeout_s=timeout,
            stall_s=stall,
            allow_numerics=allow_numerics,
            progress=progress,
            keep_explicit=keep_explicit,
            output_tolerance=output_tolerance,
            min_agreement=min_agreement,
            draft_model=draft_model,
            budget_min=budget,
            full=full,
        ),
    )
    if result is None:
        return code
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        with RunStore() as store:  # the trials' diffs: where each arm changed the step
            changes = explain_result(store, result)
        render(result, term.console(), changes=changes)
    return 0


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
            return None, 1
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
            if state["phase"] == "confirm":
                label = f"confirming the kept fixes: {label}"
            self.progress.update(
                self.task, completed=state["done"], total=state["total"], description=label
            )


def trial_line(state: dict[str, Any], started: dict[tuple[str, int, str], float]) -> str:
    """One plain line for a trial's start or end (``started`` keeps the start times)."""
    key = (str(state["arm"]), int(state["trial"]), str(state.get("phase")))
    what = f"{state['arm']} #{int(state['trial']) + 1}"
    total = state.get("total") or "?"
    start = state["event"] == "trial_start"
    if state.get("phase") == "confirm":
        # a phase of its own, counted in its own trials: the main count never runs past
        # its total ("16/16", then "17/20")
        counter = f"confirming the kept fixes, {what} of {state['trials']}"
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


def render(result: dict[str, Any], console: Any, changes: Mapping[str, str] | None = None) -> None:
    """The experiment's report on the terminal (or a pipe: see ``cli.term``).

    Fields added after the first stored results (``keep_explicit``, ``contention``, a
    candidate ``not_applied``, a fix's ``note``) are read with ``.get``: an experiment
    stored by an older stepscope still renders. ``changes``: each arm's line of
    ``arm_changes.explain_result`` (what it changed most against the baseline), a
    column of the candidates' table; it reads the trials' traces, so the caller says
    whether it is worth it.
    """
    base = result["baseline"]
    unit, median = ("requests", "request") if result.get("guard") == "tokens" else ("steps", "step")
    console.print(
        f"[bold]Experiment {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"{trials_phrase(result)} x {result['steps']} {unit} per arm, interleaved; "
        f"baseline median {median} {_secs(base['step_time_median_s'])}"
        f" (warm-up: {base['warmup']['steps']} {unit} excluded)"
    )
    explicit = _explicit_line(result.get("keep_explicit"))
    if explicit:
        console.print(f"[dim]{explicit}[/dim]")
    table = term.table(title="Candidates", title_justify="left")
    inference = any(c.get("latency") for c in result["candidates"])  # p50/p99 ratios
    # every candidate against the baseline; the per-fix table says what each adds on top
    for col in (
        "candidate",
        "fixes",
        "status",
        "vs baseline",
        "95 % CI",
        "verdict",
        guarded(result),
    ):
        table.add_column(col)
    for col in ("p50 latency", "p99 latency") if inference else ():
        table.add_column(col)
    if changes is not None:
        table.add_column("changed most vs baseline (first trials)", overflow="fold")
    for c in result["candidates"]:
        cells = _candidate_cells(c, stopped_status(c, result))
        line = () if changes is None else (esc(changes.get(c["name"], "-")),)
        table.add_row(*cells, *(_latency_cells(c) if inference else ()), *line)
    console.print(table)
    for name, why in stopped_lines(result):
        console.print(f"  [yellow]{esc(name)}[/]: {esc(why)}")
    for c in result["candidates"]:
        if c.get("status") == "not_applied":
            continue  # said in its row: the runner's error repeats the same reason
        if c.get("error"):
            console.print(f"  [red]{esc(c['name'])}[/]: {esc(c['error'])}")
        elif c.get("quality_ok") is False:
            console.print(f"  [red]{esc(c['name'])}[/]: {esc(c['quality']['reason'])}")
        agreement = (c.get("agreement") or {}).get("text")  # why "disagree", or a batch note
        if agreement and not c.get("error"):
            console.print(f"  [yellow]{esc(c['name'])}[/]: {esc(agreement)}")
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        console.print(f"[bold yellow]warning: {esc(warning)}[/]")
    repeated = repeat_line(result)
    if repeated:
        console.print(f"[yellow]{esc(repeated)}[/]")

    fixes = term.table(title="Predicted vs measured, per fix", title_justify="left")
    for col in ("fix", "parameters", "predicted (bound)", "measured", "95 % CI", "verdict", "keep"):
        fixes.add_column(col)
    for f in result["fixes"]:
        against = "" if f["against"] == "baseline" else f" over {esc(f['against'])}"
        fixes.add_row(
            esc(f["id"]),
            esc(", ".join(f"{k}={v}" for k, v in f["params"].items())),
            _bounds(f),
            fmt_ratio(f["measured"], none="-") + against if f["measured"] else "-",
            fmt_ci(f["ci"], none="-"),
            _fix_verdict(f),
            "[green]yes[/]" if f["kept"] else "no",
        )
    console.print(fixes)
    for f in result["fixes"]:
        if f.get("note"):
            console.print(f"  [bold]{esc(f['id'])}[/]: {esc(f['note'])}")
    design = design_line(result)
    if design:
        console.print(f"[dim]{esc(design)}[/dim]")
    best = result["best"]
    if best["fixes"]:
        how = "confirmed in a run of its own" if best.get("confirmed") else "measured"
        over = over_text(best)
        how += f"; {over}" if over else ""
        console.print(
            f"[bold green]Keep: {esc(', '.join(best['fixes']))}[/] — {fmt_ratio(best['speedup'], none='-')} "
            f"({fmt_ci(best['ci'], none='-')}, {how})"
        )
    else:
        console.print(
            f"[bold]No fix measured faster with the {guarded(result)} kept: "
            "keep the job as it is.[/]"
        )


def _candidate_cells(c: dict[str, Any], stopped: str | None = None) -> tuple[str, ...]:
    name, fixes = esc(c["name"]), esc(", ".join(c["fixes"]))
    if c.get("status") == "not_applied":
        why = f"[yellow]{esc(not_applied_text(c))}[/]"
        return name, fixes, "[yellow]not applied[/]", "-", "-", why, "-"
    failed = c.get("status") == "failed" or c.get("error")
    status = f"[red]{esc(c.get('failure') or 'failed')}[/]" if failed else esc(c["status"])
    if stopped and not failed:
        status = f"[yellow]{esc(stopped)}[/]"
    return (
        name,
        fixes,
        status,
        fmt_ratio(c.get("speedup"), none="-"),
        fmt_ci(c.get("ci"), none="-"),
        _verdict(c.get("verdict")),
        _quality(c),
    )


def _latency_cells(c: dict[str, Any]) -> tuple[str, str]:
    """An inference candidate's latency ratios, baseline/candidate: '1.21x (1.10–1.35x)'."""
    lat = c.get("latency") or {}
    p50, p99 = (
        f"{fmt_ratio(r['ratio'])} ({fmt_ci(r['ci'])})" if r else "-"
        for r in (lat.get("p50"), lat.get("p99"))
    )
    return p50, p99


def _fix_verdict(f: dict[str, Any]) -> str:
    if f.get("verdict"):
        return _verdict(f["verdict"])
    if f.get("status") == "not applied":
        why = f.get("not_applied_why") or "no reason recorded"
        return f"[yellow]not applied: {esc(why)}[/]"
    return esc(f.get("status") or "-")


def _explicit_line(keep: bool | None) -> str | None:
    """How the trials treated values the script set itself (None: an older result)."""
    if keep is None:
        return None
    if keep:
        return "values the script set explicitly were kept (--keep-explicit)"
    return "fixes override values the script set explicitly (each trial's log says what)"


def _bounds(fix: dict) -> str:
    """The diagnosis' bound, and the one from this experiment's baseline when known."""
    text = f"<= {fmt_ratio(fix['predicted'], none='-')}" if fix["predicted"] else "-"
    here = fix.get("predicted_in_experiment")
    if here:
        text += f" (<= {fmt_ratio(here, none='-')} here)"
    return text


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def _verdict(verdict: str | None) -> str:
    colour = {"faster": "green", "slower": "red"}.get(verdict or "", "yellow")
    return "-" if verdict is None else f"[{colour}]{esc(verdict)}[/]"


def _quality(c: dict[str, Any]) -> str:
    if c.get("quality_ok") is None:
        return "-" if c["status"] in ("failed", NOT_RUN) else "not checked"
    return f"[{'green' if c['quality_ok'] else 'red'}]{guard_word(c['quality_ok'])}[/]"


__all__ = ["ProgressView", "cmd_optimize", "render", "trial_line"]
