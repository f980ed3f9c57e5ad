"""`stepscope optimize RUN`: re-run a recorded job with fixes applied and prove the gain.

A thin shell over ``optim_runner.experiment.run_experiment``. Progress goes to stderr
(a rich progress bar with the current arm), so that ``--json`` leaves stdout to the
JSON alone; the report is a table per candidate and predicted vs measured per fix.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def cmd_optimize(
    run_ref: str,
    fixes: str | None = None,
    steps: int = 30,
    trials: int = 3,
    timeout: float | None = None,
    allow_numerics: bool = False,
    as_json: bool = False,
) -> int:
    from rich.console import Console

    from stepscope.optim_runner.experiment import ExperimentError, run_experiment
    from stepscope.store import RunStore

    err = Console(stderr=True)
    fix_ids = [f.strip() for f in fixes.split(",") if f.strip()] if fixes else None
    with RunStore() as store:
        run_id = store.resolve_run(run_ref)
        with _ProgressView(err, run_id) as view:
            try:
                result = run_experiment(
                    store,
                    run_id,
                    fixes=fix_ids,
                    steps=steps,
                    trials=trials,
                    timeout_s=timeout,
                    allow_numerics=allow_numerics,
                    progress=view.update,
                )
            except (ValueError, ExperimentError) as exc:
                view.stop()
                print(f"stepscope: {exc}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                view.stop()
                print("stepscope: experiment interrupted", file=sys.stderr)
                return 130
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        render(result, Console())
    return 0


class _ProgressView:
    """A rich progress bar fed by the experiment's progress callback."""

    def __init__(self, console: Any, run_id: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("[bold]optimize run {task.fields[run]}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("starting", total=None, run=run_id)
        self.console = console

    def __enter__(self) -> _ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.progress.stop()

    def update(self, state: dict[str, Any]) -> None:
        arm = state["arm"]
        label = f"{arm} (trial {state['trial'] + 1}/{state['trials']})"
        if state["phase"] == "confirm":
            label += " confirming the kept fixes"
        if state["event"] == "trial_end" and state.get("error"):
            self.progress.console.print(
                f"[red]{arm} failed[/] (run {state['run_id']}): {state['error']}"
            )
        self.progress.update(
            self.task, completed=state["done"], total=state["total"], description=label
        )


def render(result: dict[str, Any], console: Any) -> None:
    """The experiment's report on the terminal."""
    from rich.table import Table

    base = result["baseline"]
    console.print(
        f"[bold]Experiment {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"{result['trials']} trials x {result['steps']} steps per arm, interleaved; "
        f"baseline median step {_secs(base['step_time_median_s'])}"
        f" (warm-up: {base['warmup']['steps']} steps excluded)"
    )
    table = Table(title="Candidates", title_justify="left")
    for col in ("candidate", "fixes", "status", "speed-up", "95 % CI", "verdict", "loss"):
        table.add_column(col)
    for c in result["candidates"]:
        table.add_row(
            c["name"],
            ", ".join(c["fixes"]),
            c["status"] if not c["error"] else f"[red]{c['failure'] or 'failed'}[/]",
            _x(c["speedup"]),
            _ci(c["ci"]),
            _verdict(c["verdict"]),
            _quality(c),
        )
    console.print(table)
    for c in result["candidates"]:
        if c["error"]:
            console.print(f"  [red]{c['name']}[/]: {c['error']}")
        elif c["quality_ok"] is False:
            console.print(f"  [red]{c['name']}[/]: {c['quality']['reason']}")

    fixes = Table(title="Predicted vs measured, per fix", title_justify="left")
    for col in ("fix", "parameters", "predicted (bound)", "measured", "95 % CI", "verdict", "keep"):
        fixes.add_column(col)
    for f in result["fixes"]:
        against = "" if f["against"] == "baseline" else f" over {f['against']}"
        fixes.add_row(
            f["id"],
            ", ".join(f"{k}={v}" for k, v in f["params"].items()),
            _bounds(f),
            _x(f["measured"]) + against if f["measured"] else "-",
            _ci(f["ci"]),
            _verdict(f["verdict"]) if f["verdict"] else f["status"],
            "[green]yes[/]" if f["kept"] else "no",
        )
    console.print(fixes)
    best = result["best"]
    if best["fixes"]:
        how = "confirmed in a run of its own" if best.get("confirmed") else "measured"
        console.print(
            f"[bold green]Keep: {', '.join(best['fixes'])}[/] — {_x(best['speedup'])} "
            f"({_ci(best['ci'])}, {how})"
        )
    else:
        console.print("[bold]No fix measured faster with the loss kept: keep the job as it is.[/]")


def _bounds(fix: dict) -> str:
    """The diagnosis' bound, and the one from this experiment's baseline when known."""
    text = f"<= {_x(fix['predicted'])}" if fix["predicted"] else "-"
    here = fix.get("predicted_in_experiment")
    if here:
        text += f" (<= {_x(here)} here)"
    return text


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ci(ci: list[float] | None) -> str:
    return "-" if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}x"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def _verdict(verdict: str | None) -> str:
    colour = {"faster": "green", "slower": "red"}.get(verdict or "", "yellow")
    return "-" if verdict is None else f"[{colour}]{verdict}[/]"


def _quality(c: dict[str, Any]) -> str:
    if c["quality_ok"] is None:
        return "-" if c["status"] == "failed" else "not checked"
    return "[green]kept[/]" if c["quality_ok"] else "[red]changed[/]"


__all__ = ["cmd_optimize", "render"]
