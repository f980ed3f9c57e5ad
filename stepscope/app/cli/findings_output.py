"""A diagnosis on the terminal: what `analyze`, `attach` and `demo` print about findings.

One module so that each verb prints a finding the same way (class label, share,
confidence, evidence, fixes), with the class names every program shares
(``BottleneckClass.label``: "I/O", "communication").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.app.cli import term
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct
from stepscope.types import BottleneckClass, Finding, phase_label

if TYPE_CHECKING:  # the analyzers import pandas: `stepscope runs` prints findings without
    from stepscope.analyzers.rules.diagnosis import Diagnosis

CLASS_STYLE = {
    BottleneckClass.IO: "cyan",
    BottleneckClass.COMPUTE: "magenta",
    BottleneckClass.MEMORY: "yellow",
    BottleneckClass.COMMUNICATION: "green",
}


def finding_text(finding: Finding | None) -> str:
    """'I/O input_pipeline 84 %', or '' before `stepscope analyze` diagnosed the run."""
    if finding is None:
        return ""
    share = "" if finding.share is None else f" {fmt_pct(finding.share, 0)}"
    return esc(f"{finding.label} {finding.subtype}{share}")


def print_findings(diagnosis: Diagnosis) -> None:
    """Each finding with its evidence and fixes, then the diagnosis' warnings."""
    console = term.console(highlight=True)
    if not diagnosis.findings:
        console.print(
            f"[bold]Diagnosis[/bold] ({diagnosis.level} level): no bottleneck above the thresholds"
        )
    for i, f in enumerate(diagnosis.findings, 1):
        style = CLASS_STYLE.get(f.klass, "white")
        share = "-" if f.share is None else f"{fmt_pct(f.share)} of step time"
        if f.phase:
            share += f", in the {phase_label(f.phase)} phase"
        console.print(
            f"[bold]{i}. [{style}]{esc(f.label)} / {esc(f.subtype)}[/{style}][/bold]  "
            f"{esc(f.title)}  [dim]({share}, confidence {f.confidence:.2f}, "
            f"{esc(diagnosis.level)} level)[/dim]"
        )
        for e in f.evidence:
            console.print(f"     • {esc(e.text)} [dim]({esc(e.source)})[/dim]")
        if f.fixes:
            t = term.table(show_header=True, header_style="bold", box=None, padding=(0, 2))
            for col in ("fix", "predicted", "auto", "numerics", "basis"):
                t.add_column(col)
            for fx in f.fixes:
                pred = "-" if fx.predicted_speedup is None else f"≤ {fx.predicted_speedup:.2f}x"
                if fx.typical:
                    pred += f" (typ. {fx.typical[0]:g}-{fx.typical[1]:g}x)"
                t.add_row(
                    esc(fx.id),
                    pred,
                    "yes" if fx.auto else "code change",
                    "changes" if fx.changes_numerics else "same",
                    esc(fx.basis),
                )
            console.print(t)
    for w in diagnosis.warnings:
        console.print(f"[yellow]warning:[/yellow] {esc(w)}")


__all__ = ["CLASS_STYLE", "finding_text", "print_findings"]
