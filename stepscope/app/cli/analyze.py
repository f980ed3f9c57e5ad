"""`stepscope analyze PATH... [--json] [--top N]`: the trace report on the terminal.

A PATH is a trace file, a folder of traces, or a run of the store (id, name, 'last')
whose trace artifacts are analysed. Bad input ends with one line on stderr naming
the file and the problem, exit code 1, never a traceback: users point this at
whatever file they have.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
from rich.table import Table

from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.rules.diagnosis import Diagnosis, diagnose_report, diagnose_run
from stepscope.analyzers.trace.breakdown import CATEGORIES
from stepscope.analyzers.trace.load import TraceError
from stepscope.app.cli import term
from stepscope.app.cli.analyze_hardware import print_phases, print_roofline
from stepscope.app.cli.analyze_nodes import nodes_json, print_nodes, run_nodes
from stepscope.app.cli.findings_output import print_findings
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct
from stepscope.store import RunNotFound, RunStore, StoreError
from stepscope.store.artifacts import ArtifactError, kind_files
from stepscope.store.store import default_home


class _InputError(Exception):
    """A PATH that is neither a file/folder nor a run with traces (message: one line)."""


def resolve_paths(paths: Sequence[str]) -> tuple[list[Path], list[int]]:
    """Files/folders stay as they are; anything else is looked up as a run of the store.

    Returns the trace files and the run ids named (a run brings its trace artifacts).
    """
    out: list[Path] = []
    runs: list[int] = []
    for p in paths:
        path = Path(p).expanduser()
        if path.exists():
            out.append(path)
            continue
        try:
            with RunStore() as store:
                run_id = store.resolve_run(p)
                arts = store.artifacts(run_id)
        except (RunNotFound, StoreError):
            raise _InputError(f"{p}: no such file, folder or run") from None
        runs.append(run_id)
        try:  # an uploaded trace is read from the artifact cache (store/artifacts.py)
            out.extend(kind_files(arts, default_home(), "trace"))
        except ArtifactError as exc:
            raise _InputError(str(exc)) from None
    return out, runs


def cmd_analyze(
    paths: Sequence[str], as_json: bool = False, top: int = 10, save: bool = True
) -> int:
    try:
        files, runs = resolve_paths(paths)
        if not files and not runs:
            raise _InputError(f"{', '.join(paths)}: nothing to analyse")
        report = analyze_trace(files, calibration_home=default_home()) if files else None
    except (TraceError, _InputError) as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"stepscope: {', '.join(paths)}: out of memory while loading", file=sys.stderr)
        return 1
    diagnosis: Diagnosis
    nodes = None
    if len(runs) == 1:
        # One run: every kind of evidence it has (steps, samples, facts), saved with it.
        with RunStore() as store:
            diagnosis = diagnose_run(store, runs[0], report=report, save=save)
            nodes = run_nodes(store, runs[0], report)
    else:
        diagnosis = diagnose_report(report)
    if as_json:
        data = report.to_json(top=top) if report is not None else {"paths": [], "steps": 0}
        if len(runs) == 1:
            data["run_id"] = runs[0]
        if nodes is not None:
            data["ranks_by_node"] = nodes_json(nodes)
        data["diagnosis_level"] = diagnosis.level
        data["findings"] = diagnosis.to_json()
        data["reason"] = diagnosis.reason  # why there is nothing to diagnose, if so
        data["warnings"] = data.get("warnings", []) + diagnosis.warnings
        sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
        return 0
    if report is not None:
        _print_report(report, top)
    elif diagnosis.reason:
        print(f"run {runs[0]}: nothing to diagnose: {diagnosis.reason}")
        return 0
    else:
        print(
            f"run {runs[0]} has no trace: diagnosis from its steps and samples only "
            f"(capture one with `stepscope capture RUN` or `stepscope run --profile-at N`)"
        )
    if nodes is not None:
        print_nodes(term.console(), nodes)
    print_findings(diagnosis)
    return 0


# -- rich rendering ----------------------------------------------------------------


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f}"


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _print_report(report: TraceReport, top: int) -> None:
    console = term.console(highlight=True)
    s = report.summary
    console.print(
        f"[bold]stepscope analyze[/bold]: {len(report.paths)} file(s), ranks {s['ranks']}, "
        f"{s['events']:,} events, {s['steps']} step(s), mean step {_ms(s['mean_step_ns'])} ms"
        + ("" if s["has_device"] else " [yellow](CPU only)[/yellow]")
    )

    t = term.table(title="Step-time breakdown (priority subtraction, tb-profiler rules)")
    t.add_column("category")
    t.add_column("mean ms/step", justify="right")
    t.add_column("share", justify="right")
    avg = report.breakdown_avg.groupby("category", sort=False)["mean_ns"].mean()
    for c in CATEGORIES:
        t.add_row(c, _ms(avg.get(c, 0.0)), fmt_pct(report.breakdown.get(c, 0.0), none="-"))
    console.print(t)
    print_phases(console, report)
    print_roofline(console, report)

    if not report.gpu.empty:
        t = term.table(title="GPU metrics")
        for col in (
            "rank",
            "device",
            "name",
            "utilisation",
            "est. SM eff.",
            "est. occupancy",
            "Tensor Core (tb)",
            "Tensor Core (incl. newer)",
        ):
            t.add_column(col, justify="right" if col not in ("name",) else "left")
        for r in report.gpu.itertuples():
            occ = (
                "-"
                if r.achieved_occupancy != r.achieved_occupancy
                else f"{r.achieved_occupancy:.1f} %"
            )
            t.add_row(
                str(r.rank),
                str(r.device),
                esc(r.name),
                fmt_pct(r.gpu_utilization, none="-"),
                fmt_pct(r.sm_efficiency, none="-"),
                occ,
                fmt_pct(r.tensor_core_share, none="-"),
                fmt_pct(r.tensor_core_share_modern, none="-"),
            )
        console.print(t)

    if report.temporal is not None and not report.temporal.empty:
        t = term.table(title="Temporal breakdown (HTA)")
        for col in ("rank", "basis", "idle", "compute", "non-compute"):
            t.add_column(col, justify="right")
        for r in report.temporal.itertuples():
            t.add_row(
                str(r.rank),
                esc(r.basis),
                f"{r.idle_pct:.1f} %",
                f"{r.compute_pct:.1f} %",
                f"{r.non_compute_pct:.1f} %",
            )
        console.print(t)

    if report.idle_time is not None and not report.idle_time.empty:
        t = term.table(title="Device idle time by cause (HTA)")
        for col in ("rank", "stream", "cause", "idle ms", "share"):
            t.add_column(col, justify="right")
        for r in report.idle_time.itertuples():
            if r.idle_ns > 0:
                t.add_row(
                    str(r.rank),
                    esc(r.stream),
                    esc(r.idle_category),
                    _ms(r.idle_ns),
                    fmt_pct(r.idle_share, none="-"),
                )
        console.print(t)

    comm = report.communication
    if comm is not None:
        console.print(
            f"[bold]Communication[/bold]: {fmt_pct(comm.get('share'), none='-')} of step time, "
            f"overlap with compute {fmt_pct(comm.get('overlap'), none='-')}"
        )
    if report.memory:
        t = term.table(title="Memory peaks")
        for col in ("device", "peak allocated MiB", "peak reserved MiB", "of capacity"):
            t.add_column(col, justify="right")
        for dev, m in report.memory.items():
            t.add_row(
                esc(dev),
                f"{m.get('peak_allocated_bytes', 0) / 2**20:,.1f}",
                f"{m.get('peak_reserved_bytes', 0) / 2**20:,.1f}",
                fmt_pct(m.get("peak_share"), none="-"),
            )
        console.print(t)

    if not report.kernels_top.empty:
        t = _name_table(
            f"Top {top} kernels by total time",
            ("kernel", "class", "count", "total ms", "mean us", "max us", "share"),
        )
        for r in report.kernels_top.head(top).itertuples():
            t.add_row(
                esc(_short(r.name)),
                esc(r._2),
                str(r.count),
                _ms(r.total_ns),
                f"{r.mean_ns / 1e3:,.1f}",
                f"{r.max_ns / 1e3:,.1f}",
                fmt_pct(r.share, none="-"),
            )
        console.print(t)

    if not report.ops_top.empty:
        t = _name_table(
            f"Top {top} CPU operators by self time",
            ("operator", "count", "self ms", "total ms", "share of self"),
        )
        for r in report.ops_top.head(top).itertuples():
            t.add_row(
                esc(_short(r.name)),
                str(r.count),
                _ms(r.self_ns),
                _ms(r.total_ns),
                fmt_pct(r.share, none="-"),
            )
        console.print(t)

    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {esc(w)}")


def _name_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table whose first column is a long name (cut with an ellipsis), then numbers."""
    t = term.table(title=title)
    t.add_column(columns[0], no_wrap=True, overflow="ellipsis", max_width=60)
    for col in columns[1:]:
        t.add_column(col, justify="right", no_wrap=True)
    return t
