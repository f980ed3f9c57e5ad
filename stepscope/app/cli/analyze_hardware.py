"""`stepscope analyze`'s hardware sections: the phases of the step, roofline and MFU.

Separate from ``analyze.py`` (the tb-profiler and HTA views) because these read the
issue-14 analyses (``analyzers/steps/phases.py``, ``analyzers/hardware/roofline.py``) and say which
peak every ratio is against: a ratio without its denominator's source is not a number
a user can act on.
"""

from __future__ import annotations

from rich.console import Console

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.steps.phases import PHASES, average_phases
from stepscope.app.cli import term
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct
from stepscope.types import PHASE_LABELS


def print_phases(console: Console, report: TraceReport) -> None:
    """Mean time per step in each phase, per rank; shares add up to the step."""
    if report.phases is None or report.phases.empty:
        return
    avg = average_phases(report.phases)
    ranks = sorted(avg["rank"].unique())
    t = term.table(title="Phases of the step (from the trace's annotations)")
    t.add_column("phase")
    for rank in ranks:
        label = f" (rank {rank})" if len(ranks) > 1 else ""
        t.add_column(f"mean ms/step{label}", justify="right")
        t.add_column(f"share{label}", justify="right")
    for phase in PHASES:
        cells = []
        for rank in ranks:
            row = avg[(avg["rank"] == rank) & (avg["phase"] == phase)]
            cells += [f"{row['mean_ns'].iloc[0] / 1e6:,.2f}", f"{row['percent'].iloc[0]:.1f} %"]
        t.add_row(PHASE_LABELS[phase], *cells)
    console.print(t)
    top = max(report.phase_shares, key=report.phase_shares.get)
    console.print(
        f"Most of the step: [bold]{PHASE_LABELS[top]}[/bold] "
        f"({fmt_pct(report.phase_shares[top], none='-')})"
    )


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else format(value, fmt)


def print_roofline(console: Console, report: TraceReport) -> None:
    """MFU of the step and each op class's place on the roofline, with the peak's source."""
    roof = report.roofline
    if roof is None:
        return
    if roof.basis != "shapes":
        console.print(f"[bold]Roofline[/bold]: no FLOPs: {esc(roof.basis)}")
        return
    if roof.peak is None:
        console.print(f"[bold]Roofline[/bold]: achieved rates only, no roofs: {esc(roof.note)}")
    else:
        console.print(
            f"[bold]MFU[/bold] {fmt_pct(roof.mfu, none='-')} of {esc(roof.peak.name)} "
            f"{roof.dtype} {_num(roof.compute_tflops, ',.4g')} TFLOP/s; memory "
            f"{_num(roof.memory_gbs, ',.4g')} GB/s, ridge {_num(roof.ridge, '.3g')} FLOP/byte"
        )
        console.print(f"  peak: {esc(roof.note)}")
    t = term.table(title="Roofline by operator class (FLOPs and bytes from recorded shapes)")
    for col in ("class", "share of op time", "TFLOP/s", "GB/s", "FLOP/byte", "bound"):
        t.add_column(col, justify="left" if col in ("class", "bound") else "right")
    t.add_column("of its roof", justify="right")
    for r in roof.classes.itertuples():
        t.add_row(
            r.op_class,
            fmt_pct(r.share, none="-"),
            _num(r.tflops, ",.3g"),
            _num(r.gbs, ",.4g"),
            _num(r.intensity, ",.3g"),
            r.bound or "-",
            fmt_pct(r.pct_of_roof, none="-"),
        )
    console.print(t)
    for w in roof.warnings:
        console.print(f"[yellow]roofline:[/yellow] {esc(w)}")
