"""A training sweep's answer in words, for the CLI and the Optimize page alike: the
largest batch that ran under the limit, its speed and peak, and the line it was
predicted from (``optim_runner/sweeps/largest_batch.py``)."""

from __future__ import annotations

from typing import Any

from stepscope.optim_runner.verdict.fits import size_text


def largest_batch_lines(largest: dict[str, Any]) -> tuple[str, str | None]:
    """(the answer, the prediction behind it or None). The answer names no batch where
    none was found, and says why."""
    limit, size = largest.get("limit_bytes"), largest.get("batch_size")
    if limit is None or size is None:
        return f"Largest batch: not found ({largest.get('why')}).", None
    text = (
        f"Largest batch that fits under {size_text(limit)} ({largest.get('limit_source')}): {size}"
    )
    if largest.get("samples_per_s"):
        text += f", {largest['samples_per_s']:.4g} samples/s"
    if largest.get("peak_bytes"):
        text += f", peak {size_text(largest['peak_bytes'])}"
    text += f"; {largest.get('why')}."
    if largest.get("note"):
        text += f" Note: {largest['note']}."
    fit = largest.get("fit")
    if not fit or largest.get("predicted") is None:
        return text, None
    return text, (
        f"The sweep's batches predicted {largest['predicted']}; the rows marked 'fit' are "
        "the runs that searched from there. Peak memory over the largest batches that ran: "
        f"{size_text(fit['fixed_bytes'])} + {size_text(fit['per_sample_bytes'])} per sample."
    )


__all__ = ["largest_batch_lines"]
