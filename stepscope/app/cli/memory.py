"""`stepscope memory RUN`: the peak of a run's capture split by what it holds.

Text: the peak's categories (bytes at the peak, share, each category's own max over the
captured steps), then the modules and the source lines whose blocks are live at the peak
(``analyzers/trace/memory_peak.py`` says how they are found and what they leave out),
then on CUDA the allocator snapshot's figures (reserved, allocated, unused, the largest
free block, segments; at an out-of-memory error, why the request failed) and the job's
lines holding its blocks (``analyzers/trace/allocator_snapshot.py``). ``--json``: the
same as one object (``allocator_snapshot``). A run without a timeline or a snapshot:
one line, exit 1.
"""

from __future__ import annotations

import sys
from typing import Any

from stepscope.analyzers.report.run_memory import NoMemoryData, run_memory
from stepscope.analyzers.report.run_snapshot import has_snapshot
from stepscope.analyzers.rules.memory_state import peak_remedies
from stepscope.analyzers.trace.allocator_snapshot import AllocatorSnapshot
from stepscope.analyzers.trace.memory_peak import MemoryBreakdown
from stepscope.app.cli import term
from stepscope.app.cli.memory_section import with_lines
from stepscope.app.cli.term import esc, print_json
from stepscope.app.formats import fmt_bytes, fmt_pct
from stepscope.errors import one_line_error
from stepscope.store import RunStore


def cmd_memory(ref: str, as_json: bool) -> int:
    with RunStore() as store:
        run_id = store.resolve_run(ref)
        try:
            breakdown = run_memory(store, run_id)
        except NoMemoryData as exc:
            print(f"stepscope: {exc}", file=sys.stderr)
            return 1
    if as_json:
        found = breakdown.to_dict()
        found["would_free"] = peak_remedies(found["peak"], breakdown.device)
        print_json({"run_id": run_id, **found})
        return 0
    print_memory(term.console(), run_id, breakdown)
    return 0


def memory_summary(store: Any, run_id: int) -> dict[str, Any] | None:
    """The Memory section: the peak's split and its lines (``stepscope memory`` has the
    tables); None for a run without a memory timeline or an allocator snapshot. A file
    that cannot be read is its one line in ``problems``, never the end of `show` or
    `analyze`."""
    return with_lines(memory_breakdown_json(store, run_id))


def memory_breakdown_json(store: Any, run_id: int) -> dict[str, Any] | None:
    """``memory_summary`` before its text lines: the breakdown's JSON form
    (``MemoryBreakdown.to_dict``), ``{"lines": [], "problems": [...]}`` for files that
    cannot be read, None without a timeline or a snapshot. What `show` keeps
    (``show_kept.py``)."""
    arts = store.artifacts(run_id)
    if "memory_timeline" not in set(arts["kind"]) and not has_snapshot(arts):
        return None
    try:
        breakdown = run_memory(store, run_id)
    except NoMemoryData:
        return None
    except Exception as exc:  # the rest of the summary is shown all the same
        return {"lines": [], "problems": [one_line_error(type(exc), exc)]}
    return breakdown.to_dict()


def print_memory(console: Any, run_id: int, b: MemoryBreakdown) -> None:
    from rich.table import Table  # local: rich is imported by term when the verb runs

    for problem in b.problems:
        console.print(f"[yellow]{esc(problem)}[/]")
    if b.peak_bytes is not None:
        head = f"Run {run_id}: peak {fmt_bytes(b.peak_bytes)} on {b.device or 'the device'}"
        if b.reserved_unused_bytes and b.reserved_unused_at == "the peak":
            head += f", and {fmt_bytes(b.reserved_unused_bytes)} reserved by the allocator unused"
    else:
        head = f"Run {run_id}: no memory timeline of a capture (no peak's split)"
    console.print(head)
    if len(b.peak):
        t = Table(title="At the peak, by what it holds")
        for col in ("category", "at the peak", "share", "max over the steps"):
            t.add_column(col, justify="left" if col == "category" else "right")
        for r in b.peak.itertuples():
            t.add_row(r.label, fmt_bytes(r.bytes), fmt_pct(r.share), fmt_bytes(r.max_bytes))
        console.print(t)
        frees = peak_remedies(b.peak.to_dict("records"), b.device)
        if frees:
            console.print(esc("would free (advice): " + "; ".join(frees)))
    if len(b.modules):
        t = Table(title="Modules: blocks allocated in their forward, live at the peak")
        for col in ("module", "bytes", "own", "blocks"):
            t.add_column(col, justify="left" if col == "module" else "right")
        for r in b.modules.itertuples():
            t.add_row(esc(r.module), fmt_bytes(r.bytes), fmt_bytes(r.own_bytes), str(r.blocks))
        console.print(t)
    if len(b.lines):
        t = Table(title="Code: the job's innermost function, live at the peak")
        for col in ("file(def line): function", "bytes", "blocks"):
            t.add_column(col, justify="left" if col.startswith("file") else "right")
        for r in b.lines.itertuples():
            t.add_row(esc(r.line), fmt_bytes(r.bytes), str(r.blocks))
        console.print(t)
    if b.attributed_bytes is not None and b.peak_bytes:
        console.print(
            f"modules and code cover {fmt_bytes(b.attributed_bytes)} of the peak: the blocks "
            "allocated inside the capture (parameters and optimizer state made before it "
            "have no stack)"
        )
    if b.allocator is not None:
        print_allocator(console, b.allocator)


def print_allocator(console: Any, a: AllocatorSnapshot) -> None:
    """The allocator snapshot: its figures, why an OOM failed, the job's lines."""
    from rich.table import Table  # local: rich is imported by term when the verb runs

    t = Table(title=f"CUDA allocator snapshot at {a.moment} (cuda:{a.device})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("reserved (segments)", fmt_bytes(a.reserved_bytes)),
        ("allocated (active blocks)", fmt_bytes(a.allocated_bytes)),
        ("reserved unused (inactive blocks)", fmt_bytes(a.unused_bytes)),
        ("largest free block", fmt_bytes(a.largest_free_block_bytes)),
        ("segments", str(a.segments) + (" (expandable)" if a.expandable else "")),
    ]
    if a.pending_free_bytes:
        rows.insert(3, ("freed, awaiting another stream", fmt_bytes(a.pending_free_bytes)))
    if a.oom is not None:
        rows += [
            ("the failing request", fmt_bytes(a.oom.asked_bytes)),
            ("free on the device then", fmt_bytes(a.oom.device_free_bytes)),
        ]
    for name, value in rows:
        t.add_row(name, value)
    console.print(t)
    explanation = a.explanation()
    if explanation:
        console.print(f"out of memory: {esc(explanation)}")
    if len(a.sites):
        t = Table(title="Code: the job's innermost line holding the allocated blocks")
        for col in ("file:line in function", "bytes", "blocks"):
            t.add_column(col, justify="left" if col.startswith("file") else "right")
        for r in a.sites.itertuples():
            t.add_row(esc(r.site), fmt_bytes(r.bytes), str(r.blocks))
        console.print(t)
    if a.no_site_bytes:
        console.print(
            f"{fmt_bytes(a.no_site_bytes)} allocated with no frame of the job's code (made "
            "before memory history was recorded, or by library code alone)"
        )
