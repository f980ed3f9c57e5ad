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


def curves_line(result: dict[str, Any]) -> str:
    """The batch each memory curve allows beside the job as it is, in one line:
    "Largest batch: 26 as it is; 52 with activation_checkpointing (2.00x, 310 samples/s)"."""

    def said(largest: dict[str, Any], base: int | None) -> str:
        size = largest.get("batch_size")
        if size is None or largest.get("limit_bytes") is None:
            return "none found"
        extra = [f"{size / base:.2f}x"] if base else []
        if largest.get("samples_per_s"):
            extra.append(f"{largest['samples_per_s']:.4g} samples/s")
        return f"{size}" + (f" ({', '.join(extra)})" if extra else "")

    plain = result.get("largest_batch") or {}
    base = plain.get("batch_size") if plain.get("limit_bytes") is not None else None
    parts = [f"{said(plain, None)} as it is"]
    for curve in result.get("curves") or []:
        parts.append(f"{said(curve['largest_batch'], base)} with {' + '.join(curve['fixes'])}")
    return "Largest batch: " + "; ".join(parts)


__all__ = ["curves_line", "largest_batch_lines"]
