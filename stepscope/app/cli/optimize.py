"""`stepscope optimize RUN`: re-run a recorded job with fixes applied and prove the gain.

A thin shell over ``optim_runner.experiment.experiment.run_experiment``. Progress goes to stderr
(a rich progress bar with the current arm on a terminal, one plain line per trial
start and end anywhere else), so that ``--json`` leaves stdout to the JSON alone; the
report is a table per candidate (with the operators and phases each changed most
against the baseline, ``optim_runner/verdict/arm_changes.py``) and predicted vs measured per fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stepscope.app.applied import not_applied_text
from stepscope.app.cli import term
from stepscope.app.cli.experiment_follow import followed
from stepscope.app.cli.optimize_fit import render_fit
from stepscope.app.cli.term import esc
from stepscope.app.design_text import (
    design_line,
    repeat_line,
    stopped_lines,
    stopped_status,
    trials_phrase,
)
from stepscope.app.formats import fmt_bytes, fmt_ci, fmt_ratio, guard_word, guarded
from stepscope.optim_runner.experiment.experiment import run_experiment
from stepscope.optim_runner.experiment.options import ExperimentOptions
from stepscope.optim_runner.verdict.arm_changes import explain_result
from stepscope.optim_runner.verdict.leave_one_out import in_set_text, loo_text
from stepscope.optim_runner.verdict.stacked import over_text
from stepscope.optim_runner.verdict.verdict import NOT_RUN
from stepscope.store import RunStore


def cmd_optimize(
    run_ref: str,
    options: ExperimentOptions | None = None,
    *,
    as_json: bool = False,
    sweep: str | None = None,
    batch_factors: str | None = None,
    memory_limit: int | None = None,
) -> int:
    """Run an experiment (or, with ``sweep``, a batch-size sweep) on ``run_ref`` and report
    it; the exit status. ``options``: the experiment's, as the CLI parsed them."""
    options = options or ExperimentOptions()
    if sweep is not None:
        # local: the sweep's module is for --sweep only
        from stepscope.app.cli.sweep import cmd_sweep

        return cmd_sweep(
            run_ref,
            batch_factors,
            options.steps,
            options.trials,
            options.timeout_s,
            as_json,
            memory_limit=memory_limit,
            fixes=list(options.fixes) if options.fixes else None,  # one memory curve each
        )
    result, code = followed(
        run_ref,
        "optimize",
        "experiment",
        lambda store, run_id, progress: run_experiment(store, run_id, options, progress),
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


def render(result: dict[str, Any], console: Any, changes: Mapping[str, str] | None = None) -> None:
    """The experiment's report on the terminal (or a pipe: see ``cli.term``).

    Fields added after the first stored results (``keep_explicit``, ``contention``, a
    candidate ``not_applied``, a fix's ``note``) are read with ``.get``: an experiment
    stored by an older stepscope still renders. ``changes``: each arm's line of
    ``arm_changes.explain_result`` (what it changed most against the baseline), a
    column of the candidates' table; it reads the trials' traces, so the caller says
    whether it is worth it.
    """
    if result.get("goal") == "fit":  # the baseline ran out of memory: which arms fit
        render_fit(result, console)
        return
    base = result["baseline"]
    unit, median = ("requests", "request") if result.get("guard") == "tokens" else ("steps", "step")
    console.print(
        f"[bold]Experiment {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"{trials_phrase(result)} x {result['steps']} {unit} per arm, interleaved; "
        f"baseline median {median} {_secs(base['step_time_median_s'])}"
        f" (warm-up: {base['warmup']['steps']} {unit} excluded)"
        + (f", peak memory {fmt_bytes(base['peak_bytes'])}" if base.get("peak_bytes") else "")
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
        "peak memory",
    ):
        table.add_column(col)
    for col in ("p50 latency", "p99 latency") if inference else ():
        table.add_column(col)
    if changes is not None:
        table.add_column("changed most vs baseline (first trials)", overflow="fold")
    for c in result["candidates"]:
        cells = _candidate_cells(c, stopped_status(c, result))
        line = () if changes is None else (esc(changes.get(c["name"], "-")),)
        peak = esc(c.get("trade") or "-")
        table.add_row(*cells, peak, *(_latency_cells(c) if inference else ()), *line)
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
    in_set = any(f.get("in_set") for f in result["fixes"])
    columns = ["fix", "parameters", "predicted (bound)", "measured", "95 % CI", "verdict"]
    for col in [*columns, *(["in the kept set"] if in_set else []), "keep"]:
        fixes.add_column(col)
    for f in result["fixes"]:
        fixes.add_row(
            esc(f["id"]),
            esc(", ".join(f"{k}={v}" for k, v in f["params"].items())),
            _bounds(f),
            f"{fmt_ratio(f['measured'])} vs {esc(f['against'])}" if f["measured"] else "-",
            fmt_ci(f["ci"], none="-"),
            _fix_verdict(f),
            *([esc(in_set_text(f))] if in_set else []),
            "[green]yes[/]" if f["kept"] else "no",
        )
    console.print(fixes)
    _leave_one_out(console, result.get("leave_one_out"))
    for f in result["fixes"]:
        if f.get("note"):
            console.print(f"  [bold]{esc(f['id'])}[/]: {esc(f['note'])}")
    design = design_line(result)
    if design:
        console.print(f"[dim]{esc(design)}[/dim]")
    best = result["best"]
    if best.get("goal") == "memory":
        colour = "bold green" if best["fixes"] else "bold"
        console.print(f"[{colour}]Goal memory: {esc(best['answer'])}[/]")
        return
    if best["fixes"]:
        how = "confirmed in a run of its own" if best.get("confirmed") else "measured"
        over = over_text(best) or loo_text(best)
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


def _leave_one_out(console: Any, record: dict[str, Any] | None) -> None:
    """Each leave-one-out step: the set, each fix taken out of it, and what that did."""
    if not record or not record.get("steps"):
        return
    table = term.table(
        title=f"Leave-one-out from {esc(record['from'])}: each fix taken out of the set",
        title_justify="left",
    )
    for col in ("set", "without", "its speed vs the set", "95 % CI", "decision"):
        table.add_column(col, overflow="fold")
    for step in record["steps"]:
        for r in step["removals"]:
            dropped = r["fix"] in step["dropped"]
            table.add_row(
                esc(step["set"]),
                esc(", ".join(r["removed"])) if r.get("arm") else "- (the baseline)",
                fmt_ratio(r.get("ratio"), none="-"),
                fmt_ci(r.get("ci"), none="-"),
                f"[{'yellow' if dropped else 'green'}]{esc(r['text'])}[/]",
            )
        if step.get("note"):
            table.add_row(esc(step["set"]), "", "", "", esc(step["note"]))
    console.print(table)
    if record.get("unsettled"):
        console.print(f"  [yellow]not settled[/]: {esc(record['unsettled'])}")


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


__all__ = ["cmd_optimize", "render"]
