"""`stepscope optimize RUN --sweep batch`: throughput and p99 latency per batch size.

A thin shell over ``optim_runner.sweeps.sweep.run_sweep``, with the experiment's progress lines
on stderr (``experiment_follow.followed``) and, on stdout, a table per batch size, the knee,
and a bar of throughput per row so the curve shows in a terminal too.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from stepscope.app.cli import term
from stepscope.app.cli.experiment_follow import followed
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct, fmt_ratio, fmt_s
from stepscope.app.largest_batch_text import curves_line, largest_batch_lines
from stepscope.optim_runner.sweeps.sweep import parse_factors, run_sweep
from stepscope.optim_runner.verdict.fits import size_text

BAR_WIDTH = 24


def cmd_sweep(
    run_ref: str,
    factors: str | None,
    steps: int,
    trials: int,
    timeout: float | None,
    as_json: bool,
    memory_limit: int | None = None,
    fixes: list[str] | None = None,
) -> int:
    try:
        chosen = parse_factors(factors) if factors else None  # None: the run's kind's default
    except ValueError as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 2
    result, code = followed(
        run_ref,
        "sweep",
        "sweep",
        lambda store, run_id, progress: run_sweep(
            store,
            run_id,
            chosen,
            steps,
            trials,
            timeout,
            progress=progress,
            memory_limit=memory_limit,
            fixes=fixes,
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
    if result.get("generation"):
        render_generation_sweep(result, console)
        return
    console.print(
        f"[bold]Batch-size sweep {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"{result['trials']} trials x {result['steps']} steps per batch size, interleaved"
    )
    training = result.get("largest_batch") is not None
    knee = result.get("knee") or {}
    console.print(_rows_table(result["rows"], "Per batch size", training, knee))
    if knee:
        console.print(f"[bold]Knee: batch {knee.get('batch_size')}[/] — {esc(knee['why'])}")
    if training:
        for line in largest_batch_lines(result["largest_batch"]):
            if line:
                console.print(esc(line))
    for curve in result.get("curves") or []:
        with_ = " + ".join(curve["fixes"])
        console.print(_rows_table(curve["rows"], f"With {with_}", True, {}))
        answer, _prediction = largest_batch_lines(curve["largest_batch"])
        console.print(esc(f"With {with_}: {answer}"))
    if result.get("curves"):
        console.print(esc(curves_line(result)))
    console.print(f"[dim]{esc(result.get('numerics') or '')}[/dim]")
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        console.print(f"[bold yellow]warning: {esc(warning)}[/]")


def _rows_table(
    rows: list[dict[str, Any]], title: str, training: bool, knee: dict[str, Any]
) -> Any:
    """One curve's table: a row per batch size (its speed, latency and peak)."""
    best = max((r.get("samples_per_s") or 0.0 for r in rows), default=0.0)
    table = term.table(title=title, title_justify="left")
    columns = ["factor", "batch", "samples/s", "95 % CI", "p50 / batch", "p99 / batch"]
    for col in [*columns, *(["peak memory"] if training else []), ""]:
        table.add_column(col)
    for r in rows:
        peak = [size_text(r.get("peak_bytes")) if r.get("peak_bytes") else "-"] if training else []
        if r.get("status") != "completed":
            why = f"[red]{esc(r.get('status'))}: {esc(_short_error(r))}[/]"
            table.add_row(_factor(r), str(r.get("batch_size") or "-"), why, "", "", "", *peak, "")
            continue
        sps = r.get("samples_per_s")
        bar = "#" * round(BAR_WIDTH * sps / best) if sps and best else ""
        mark = "  [bold green]<- knee[/]" if r["factor"] == knee.get("factor") else ""
        table.add_row(
            _factor(r),
            _batch(r),
            f"{sps:.4g}" if sps else "-",
            _interval(r.get("samples_per_s_ci"), 1.0),
            _ms(r.get("p50_s"), r.get("p50_ci")),
            _ms(r.get("p99_s"), r.get("p99_ci")),
            *peak,
            bar + mark,
        )
    return table


def render_generation_sweep(result: dict[str, Any], console: Any) -> None:
    """A generation job's requests batched: tokens/s, latency and the answers kept."""
    console.print(
        f"[bold]Batch sweep {result['experiment_id']}[/] on run {result['baseline_run']}: "
        f"its first {result['prompts']} requests' prompts (recorded by run "
        f"{result.get('capture_run')}), {result['trials']} trial(s) per batch size"
    )
    rows = result["rows"]
    best = max((r.get("tokens_per_s") or 0.0 for r in rows), default=0.0)
    table = term.table(title="Per batch size", title_justify="left")
    for col in ("batch", "tokens/s", "vs batch 1", "request p50", "request p99", "same tokens", ""):
        table.add_column(col)
    knee = result.get("knee") or {}
    for r in rows:
        if r.get("status") != "completed":
            why = f"[red]{esc(r.get('status'))}: {esc(r.get('error') or '')}[/]"
            table.add_row(str(r["batch_size"]), why, "", "", "", "", "")
            continue
        tps = r.get("tokens_per_s")
        bar = "#" * round(BAR_WIDTH * tps / best) if tps and best else ""
        mark = "  [bold green]<- knee[/]" if r["batch_size"] == knee.get("batch_size") else ""
        ci = r.get("ci")
        ratio = "1.00x" if r["batch_size"] == 1 else fmt_ratio(r.get("speedup"))
        if ci and r["batch_size"] != 1:
            ratio += f" ({ci[0]:.2f}–{ci[1]:.2f}x)"
        agreement = r.get("token_agreement")
        same = "-" if agreement is None else fmt_pct(agreement)
        if r.get("first_divergence") is not None:
            same += f" (first at token {r['first_divergence']})"
        table.add_row(
            str(r["batch_size"]),
            f"{tps:.4g}" if tps else "-",
            ratio,
            fmt_s(r["request_p50_s"]) if r.get("request_p50_s") is not None else "-",
            fmt_s(r["request_p99_s"]) if r.get("request_p99_s") is not None else "-",
            same,
            bar + mark,
        )
    console.print(table)
    if knee:
        console.print(f"[bold]Knee: batch {knee.get('batch_size')}[/] — {esc(knee['why'])}")
    console.print(f"[dim]{esc(result.get('numerics') or '')}[/dim]")
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        console.print(f"[bold yellow]warning: {esc(warning)}[/]")


def _short_error(row: dict[str, Any]) -> str:
    """A failed row's error in a table cell: 'ran out of memory', or its first 80 chars."""
    if row.get("failure") == "oom":
        return "ran out of memory"
    error = row.get("error") or ""
    return error if len(error) <= 80 else error[:79] + "…"


def _factor(row: dict[str, Any]) -> str:
    """'x4', or 'fit' for a run the largest-batch search added."""
    return "fit" if row.get("confirm") else f"x{row['factor']:g}"


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
