"""`stepscope optimize` on a run that ran out of memory: which arms fit, and the answer.

The experiment's result (``optim_runner/verdict/fits.py``) has no ratios: the baseline
ran out again under its limit, so each candidate is shown in absolute figures (whether it
fits, its measured peak, its speed), then one answer line, the same the Optimize page
shows (``best.answer``).
"""

from __future__ import annotations

from typing import Any

from stepscope.app.cli import term
from stepscope.app.cli.term import esc
from stepscope.optim_runner.verdict.fits import fit_status, size_text


def render_fit(result: dict[str, Any], console: Any) -> None:
    """The candidates under the baseline's memory limit, and the answer line."""
    oom = result.get("out_of_memory") or {}
    console.print(
        f"[bold]Experiment {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"the baseline ran out of memory again (run {oom.get('check_run')}); "
        f"{_trials(result['trials'])} x {result['steps']} steps per candidate under the same limit"
    )
    table = term.table(title="Candidates under the limit", title_justify="left")
    for col in ("candidate", "fixes", "status", "peak memory", "speed"):
        table.add_column(col)
    for c in result["candidates"]:
        status = fit_status(c)
        colour = "green" if c.get("fits") else "red" if c.get("fits") is False else "yellow"
        table.add_row(
            esc(c["name"]),
            esc(", ".join(c["fixes"])),
            f"[{colour}]{esc(status)}[/]",
            size_text(c["peak_bytes"]) if c.get("peak_bytes") else "-",
            esc(c.get("speed") or "-"),
        )
    console.print(table)
    for c in result["candidates"]:
        if c.get("error") and c.get("status") != "not_applied":
            console.print(f"  [red]{esc(c['name'])}[/]: {esc(c['error'])}")
    best = result["best"]
    colour = "bold green" if best.get("fits") else "bold"
    console.print(f"[{colour}]{esc(best['answer'])}[/]")
    if best.get("fits"):
        console.print(f"[dim]{esc(oom.get('guard') or '')}[/dim]")


def _trials(n: int) -> str:
    """Every candidate gets its trials (no baseline to stop them early against)."""
    return f"{n} trial" if n == 1 else f"{n} trials"


__all__ = ["render_fit"]
