"""`stepscope optimize RUN --sweep batch`: throughput and p99 latency per batch size.

A thin shell over ``optim_runner.sweep.run_sweep``, with the experiment's progress lines
on stderr (``optimize.followed``) and, on stdout, a table per batch size, the knee,
and a bar of throughput per row so the curve shows in a terminal too.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from stepscope.app.cli import term
from stepscope.app.cli.optimize import followed
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_s
from stepscope.optim_runner.sweep import parse_factors, run_sweep

BAR_WIDTH = 24


def cmd_sweep(
    run_ref: str,
    factors: str | None,
    steps: int,
    trials: int,
    timeout: float | None,
    as_json: bool,
) -> int:
    try:
        chosen = parse_factors(factors)
    except ValueError as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 2
    result, code = followed(
        run_ref,
        "sweep",
        "sweep",
        lambda store, run_id, progress: run_sweep(
            store, run_id, chosen, steps, trials, timeout, progress=progress
        ),
    )
    if result is None:
        return code
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        render_sweep(result, term.console())
    return 0


def render_sweep(result: dict[str, Any], console: Any) -> None:
    """The sweep's table, one row per batch size, and the knee."""
    console.print(
        f"[bold]Batch-size sweep {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"{result['trials']} trials x {result['steps']} steps per batch size, interleaved"
    )
    rows = result["rows"]
    best = max((r.get("samples_per_s") or 0.0 for r in rows), default=0.0)
    table = term.table(title="Per batch size", title_justify="left")
    for col in ("factor", "batch", "samples/s", "95 % CI", "p50 / batch", "p99 / batch", ""):
        table.add_column(col)
    knee = result.get("knee") or {}
    for r in rows:
        if r.get("status") != "completed":
            why = f"[red]{esc(r.get('status'))}: {esc(r.get('error') or '')}[/]"
            table.add_row(f"x{r['factor']}", "-", why, "", "", "", "")
            continue
        sps = r.get("samples_per_s")
        bar = "#" * round(BAR_WIDTH * sps / best) if sps and best else ""
        mark = "  [bold green]<- knee[/]" if r["factor"] == knee.get("factor") else ""
        table.add_row(
            f"x{r['factor']}",
            _batch(r),
            f"{sps:.4g}" if sps else "-",
            _interval(r.get("samples_per_s_ci"), 1.0),
            _ms(r.get("p50_s"), r.get("p50_ci")),
            _ms(r.get("p99_s"), r.get("p99_ci")),
            bar + mark,
        )
    console.print(table)
    if knee:
        console.print(f"[bold]Knee: batch {knee.get('batch_size')}[/] — {esc(knee['why'])}")
    console.print(f"[dim]{esc(result.get('numerics') or '')}[/dim]")
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        console.print(f"[bold yellow]warning: {esc(warning)}[/]")


def _batch(row: dict[str, Any]) -> str:
    """The batch the steps recorded; where the fix's own read-back differs, both."""
    batch, applied = row.get("batch_size"), row.get("applied")
    if applied is not None and batch is not None and applied != batch:
        return f"{batch} (loader {applied})"
    return str(batch if batch is not None else "-")


def _interval(ci: list[float] | None, scale: float) -> str:
    return "-" if not ci else f"{ci[0] * scale:.4g}–{ci[1] * scale:.4g}"


def _ms(value: float | None, ci: list[float] | None) -> str:
    """'12.3 ms (11.0 ms–14.1 ms)'."""
    if value is None:
        return "-"
    return fmt_s(value) + (f" ({fmt_s(ci[0])}–{fmt_s(ci[1])})" if ci else "")


__all__ = ["cmd_sweep", "render_sweep"]
