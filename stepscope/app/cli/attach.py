"""`stepscope attach PID`: record a running process, then diagnose what was recorded.

A thin shell over ``collectors.attach.attach``: a rich progress bar on stderr while it
records (Ctrl-C detaches early and keeps the recording), then where the main thread
spent its time and the diagnosis. ``--list`` shows what one could attach to.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.steps.stacks import classify_samples, phase_shares, top_sites
from stepscope.app.cli import term
from stepscope.app.cli.findings_output import print_findings
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_bytes, fmt_pct
from stepscope.collectors.attach.attach import AttachError, attach
from stepscope.collectors.attach.process_list import candidates
from stepscope.store import RunStore


def cmd_attach(
    pid: int | None,
    duration: float,
    name: str | None,
    rate: int,
    as_json: bool = False,
    list_only: bool = False,
    quiet: bool = False,
    inject: bool = True,
) -> int:
    err = term.console(stderr=True, quiet=quiet)
    if list_only or pid is None:
        with RunStore() as store:
            return _list(store.home, as_json)

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _Progress(err, pid) as view:
            result = attach(
                pid,
                duration_s=duration,
                name=name,
                rate_hz=rate,
                stop=stop,
                on_progress=view.update,
                inject_collectors=inject,
            )
    except AttachError as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for message in result.messages:
        err.print(f"[yellow]stepscope:[/yellow] {esc(message)}")

    with RunStore() as store:
        diagnosis = diagnose_run(store, result.run_id)
        classified = classify_samples(store.stack_samples(result.run_id))
    shares, sites = phase_shares(classified), top_sites(classified)
    if as_json:
        out: dict[str, Any] = {
            "run_id": result.run_id,
            "status": result.status,
            "stop_reason": result.stop_reason,
            "elapsed_s": round(result.elapsed_s, 2),
            "stack_samples": result.stack_samples,
            "messages": result.messages,
            "phases": shares.to_dict("records"),
            "sites": sites.to_dict("records"),
            "diagnosis_level": diagnosis.level,
            "findings": diagnosis.to_json(),
        }
        print(json.dumps(out, indent=1))
        return 0
    console = term.console(quiet=quiet)
    _print_phases(console, shares, sites)
    if not quiet:
        print_findings(diagnosis)
    console.print(f"[dim]run {result.run_id} — stepscope show {result.run_id}[/dim]")
    return 0


def _print_phases(console: Any, shares: Any, sites: Any) -> None:
    if shares.empty:
        console.print("no stack samples: the diagnosis rests on the system samples alone")
        return
    console.print("[bold]Where the main thread spends its time[/bold] (stack samples)")
    t = term.table(box=None)
    for col in ("phase", "share", "samples"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for r in shares.itertuples():
        t.add_row(esc(r.label), fmt_pct(r.share), str(r.samples))
    console.print(t)
    console.print("[bold]Top lines of the job's own code[/bold]")
    s = term.table(box=None)
    for col in ("line", "phase", "share"):
        s.add_column(col, justify="right" if col == "share" else "left")
    for r in sites.head(5).itertuples():
        s.add_row(esc(r.site), esc(r.category), fmt_pct(r.share))
    console.print(s)


def _list(home: Any, as_json: bool) -> int:
    rows = candidates(home)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    t = term.table(title="processes to attach to", title_justify="left")
    for col in ("pid", "user", "cpu", "memory", "GPU memory", "stepscope", "command"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r["pid"]),
            esc(r["user"] or "?"),
            "-" if r["cpu_percent"] is None else f"{r['cpu_percent']:.0f} %",
            "-" if r["rss_bytes"] is None else fmt_bytes(r["rss_bytes"]),
            "-" if r["gpu_mem_bytes"] is None else fmt_bytes(r["gpu_mem_bytes"]),
            f"run {r['run_id']}" if r["run_id"] is not None else "",
            esc(r["command"][:80]),
        )
    console = term.console()
    console.print(t)
    if not rows:
        console.print("no Python or GPU processes found")
    return 0


class _Progress:
    """Seconds recorded out of the duration, and stack samples so far."""

    def __init__(self, console: Any, pid: int) -> None:
        self.progress = Progress(
            TextColumn(f"attached to {pid}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[samples]} stack samples"),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("attach", total=1.0, samples=0)

    def __enter__(self) -> _Progress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def update(self, p: Any) -> None:
        self.progress.update(
            self.task,
            total=p.duration_s,
            completed=min(p.elapsed_s, p.duration_s),
            samples=p.stack_samples,
        )
