"""The KV cache in one line, the same in `stepscope show` and on the Run page.

The figures are ``analyzers/steps/generation.kv_cache_figures``'s: the cache at its
largest request, what one more position of context costs per row, and its part of that
request's peak memory (the job's CUDA peak where it used CUDA, else its RSS).
"""

from __future__ import annotations

from typing import Any

from stepscope.app.formats import fmt_bytes, fmt_pct

__all__ = ["kv_cache_line"]


def kv_cache_line(kv: dict[str, Any] | None) -> str | None:
    """None for a run with no cache measured."""
    if not kv:
        return None
    shape = f"request {kv['request']}: {kv['rows']} row{'s' if kv['rows'] != 1 else ''}"
    if kv.get("context"):
        shape += f" x {kv['context']} positions"
    if kv.get("per_token"):
        shape += f", {fmt_bytes(kv['per_token'])} per position per row"
    elif kv.get("allocated_whole"):
        shape += ", allocated whole: its full length from the first token"
    line = f"KV cache {fmt_bytes(kv['bytes'])} at its largest ({shape})"
    if kv.get("share") is not None:
        basis = "CUDA memory" if kv.get("peak_basis") == "cuda" else "RSS"
        line += f", {fmt_pct(kv['share'])} of that request's peak {basis}"
        line += f" ({fmt_bytes(kv['peak_bytes'])})"
    return line
