"""The few memory lines `show` and `analyze` print: the peak and what holds it.

Read from the breakdown's JSON form (``MemoryBreakdown.to_dict``, as ``memory_summary``
returns it and the store keeps it for `show`), never from its frames: `show` prints a
kept breakdown without importing pandas or the trace analyzers, and the lines are worded
here each time, so a change of wording needs no figure computed again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepscope.analyzers.rules.memory_state import peak_remedies
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_bytes, fmt_pct

#: the peak's parts and the modules a line names, largest first
SHOWN_PARTS = 3


def memory_lines(b: Mapping[str, Any]) -> list[str]:
    """A few lines for `show`: the peak and its three largest parts, the modules that
    hold the most at the peak, and the allocator snapshot's figures."""
    lines = []
    if b.get("peak_bytes") is not None:
        parts = [
            f"{r['label']} {fmt_bytes(r['bytes'])} ({fmt_pct(r['share'])})"
            for r in b.get("peak") or []
            if r["bytes"] > 0
        ][:SHOWN_PARTS]
        head = f"peak {fmt_bytes(b['peak_bytes'])} on {b.get('device') or 'the device'}"
        lines.append(head + (": " + ", ".join(parts) if parts else ""))
    modules = (b.get("modules") or [])[:SHOWN_PARTS]
    if modules:
        top = ", ".join(f"{r['module']} {fmt_bytes(r['bytes'])}" for r in modules)
        lines.append(f"modules holding the most at the peak: {top}")
    frees = peak_remedies(b.get("peak") or [], b.get("device"))
    if frees:
        lines.append("would free (advice): " + "; ".join(frees))
    if b.get("allocator_snapshot"):
        lines += allocator_lines(b["allocator_snapshot"])
    return lines


def allocator_lines(a: Mapping[str, Any]) -> list[str]:
    """The snapshot (its JSON form) in a line or two: its figures, and at an OOM why
    the request failed."""
    segments = a.get("segments") or 0
    lines = [
        f"allocator snapshot at {a.get('moment')} on {a.get('device')}: "
        f"{fmt_bytes(a.get('reserved_bytes'))} reserved, {fmt_bytes(a.get('allocated_bytes'))} "
        f"allocated, {fmt_bytes(a.get('reserved_unused_bytes'))} reserved unused, largest free "
        f"block {fmt_bytes(a.get('largest_free_block_bytes'))}, "
        f"{segments} segment{'s' * (segments != 1)}"
    ]
    if a.get("explanation"):
        lines.append(f"out of memory: {a['explanation']}")
    return lines


def with_lines(mem: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The memory section as `show` and `analyze` print it: the breakdown's JSON form
    with its ``lines`` (the text above) in place of the source lines' rows; a section
    that is only a problem (the files could not be read) as it is."""
    if mem is None:
        return None
    if "peak_bytes" not in mem:  # {"lines": [], "problems": [...]}: nothing to word
        return dict(mem)
    return {**mem, "lines": memory_lines(mem)}


def print_memory_section(console: Any, run_id: int, mem: Mapping[str, Any] | None) -> None:
    """`show`'s and `analyze`'s few memory lines (``with_lines``); nothing without."""
    if mem:
        console.print(f"[bold]memory[/] (stepscope memory {run_id})")
        console.print("\n".join(esc(line) for line in [*mem["problems"], *mem["lines"]]))
