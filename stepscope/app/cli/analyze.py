"""`stepscope analyze PATH... [--json] [--top N] [--workers N] [--ray ADDRESS]`: the
trace report on the terminal.

A PATH is a trace file, a folder of traces, an ``s3://`` object (or ``s3://.../`` prefix),
or a run of the store (id, name, 'last') whose trace artifacts are analysed. The ranks
are analysed side by side (``--workers``), or as tasks of a Ray cluster (``--ray``), where
a run's traces in S3 go to the tasks as their URIs: each task reads its own rank from the
object store, nothing passes through this process. Bad input ends with one line on stderr
naming the file and the problem, exit code 1, never a traceback: users point this at
whatever file they have.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from stepscope.analyzers.report.ray_pool import RayPoolError
from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.rules.diagnosis import Diagnosis, diagnose_report, diagnose_run
from stepscope.analyzers.trace.breakdown import CATEGORIES
from stepscope.analyzers.trace.load import TraceError, is_s3
from stepscope.app.cli import term
from stepscope.app.cli.analyze_hardware import print_phases, print_roofline
from stepscope.app.cli.analyze_nodes import nodes_json, print_nodes, run_nodes
from stepscope.app.cli.findings_output import print_findings
from stepscope.app.cli.memory import memory_summary
from stepscope.app.cli.memory_section import print_memory_section
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_pct
from stepscope.store import RunNotFound, RunStore, StoreError
from stepscope.store.artifact_paths import allowed_object
from stepscope.store.artifacts import ArtifactError, artifact_location, kind_files, local_copy
from stepscope.store.store import default_home


class _InputError(Exception):
    """A PATH that is neither a file/folder nor a run with traces (message: one line)."""


def resolve_paths(paths: Sequence[str], remote: bool = False) -> tuple[list[Path | str], list[int]]:
    """Files/folders and ``s3://`` URIs stay as they are; anything else is looked up as a
    run of the store.

    Returns the trace sources and the run ids named (a run brings its trace artifacts).
    ``remote``: a Ray cluster reads them, so a path is made absolute and a run's artifact
    in S3 stays its URI (the client makes no local copy).
    """
    out: list[Path | str] = []
    runs: list[int] = []
    for p in paths:
        if is_s3(p):
            out.append(p)
            continue
        path = Path(p).expanduser()
        if path.exists():  # absolute for a cluster: its tasks run in other folders
            out.append(path.resolve() if remote else path)
            continue
        try:
            with RunStore() as store:
                run_id = store.resolve_run(p)
                arts = store.artifacts(run_id)
        except RunNotFound:
            raise _InputError(f"{p}: no such file, folder or run") from None
        except StoreError as exc:  # not a file, and the runs cannot be read to tell
            raise _InputError(f"{p}: no such file or folder; as a run: {exc}") from None
        runs.append(run_id)
        try:  # an uploaded trace is read from the artifact cache (store/artifacts.py)
            out.extend(_remote_traces(arts) if remote else kind_files(arts, default_home()))
        except ArtifactError as exc:
            raise _InputError(str(exc)) from None
    return out, runs


def _remote_traces(arts: Any) -> list[Path | str]:
    """A run's traces for Ray tasks, in the store's order: an object in S3 as its URI
    (the task downloads its own rank), any other as its local file."""
    if arts is None or len(arts) == 0:
        return []
    out: list[Path | str] = []
    location = artifact_location()
    for row in arts[arts["kind"] == "trace"].itertuples():
        path, run_id = str(row.path), int(row.run_id)
        local = (getattr(row, "meta", None) or {}).get("local_path")
        if is_s3(path):  # read by the task, but only where the run's objects are written
            out.append(allowed_object(path, run_id, location))
        else:
            out.append(local_copy(path, default_home(), local, run_id=run_id))
    return out


@contextlib.contextmanager
def _rank_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A bar on a terminal's stderr while the ranks of a multi-rank job are analysed
    (gone when done); nothing for one trace, a pipe or a file."""
    if not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("analysing ranks"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("ranks", total=None, visible=False)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, visible=total > 1)

        yield tick


def cmd_analyze(
    paths: Sequence[str],
    as_json: bool = False,
    top: int = 10,
    save: bool = True,
    workers: int | None = None,
    ray_address: str | None = None,
) -> int:
    try:
        files, runs = resolve_paths(paths, remote=bool(ray_address))
        if not files and not runs:
            raise _InputError(f"{', '.join(paths)}: nothing to analyse")
        report = None
        if files:
            with _rank_progress() as progress:
                report = analyze_trace(
                    files,
                    default_home(),
                    workers=workers,
                    ray_address=ray_address,
                    progress=progress,
                )
    except (TraceError, _InputError, RayPoolError) as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"stepscope: {', '.join(paths)}: out of memory while loading", file=sys.stderr)
        return 1
    diagnosis: Diagnosis
    nodes = memory = None
    if len(runs) == 1:
        # One run: every kind of evidence it has (steps, samples, facts), saved with it.
        with RunStore() as store:
            diagnosis = diagnose_run(store, runs[0], report=report, save=save)
            nodes = run_nodes(store, runs[0], report)
            memory = memory_summary(store, runs[0])  # where its peak goes, if captured
    else:
        diagnosis = diagnose_report(report)
    if as_json:
        data = report.to_json(top=top) if report is not None else {"paths": [], "steps": 0}
        if len(runs) == 1:
            data["run_id"] = runs[0]
        if nodes is not None:
            data["ranks_by_node"] = nodes_json(nodes)
        if len(runs) == 1:
            data["memory_breakdown"] = memory
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
    if len(runs) == 1:
        print_memory_section(term.console(), runs[0], memory)
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
