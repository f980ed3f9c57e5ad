"""The largest training batch that fits: peak memory fitted against the batch size,
predicted under the memory limit, and confirmed by running it.

What people do today is try batch sizes until one does not crash (Lightning's batch-size
finder, accelerate's ``find_executable_batch_size``): each try costs a run and says
nothing of why. A sweep already measures each batch size's peak, and a training step's
peak grows with the batch by the activations it keeps (per sample) on top of what does
not (parameters, gradients, optimizer state): ``peak = fixed + per_sample x batch``. The
line through the measured points, set equal to the limit, predicts the largest batch;
one run at that batch confirms it.

The line is a guide, not the answer. On the CPU, glibc's allocator keeps tensors below
its mapping threshold (at most 32 MiB) in a heap that holds what it once held, and maps
and unmaps larger ones one by one, so the peak memory is not even monotonic in the batch:
the corpus's six-block GPT trainer peaked at 1.52 GB of address space (1.07 GB resident)
at batch 8 and 1.26 GB (0.81 GB) at batch 16, once its attention scores crossed the
threshold. So the line is fitted to the ``FIT_POINTS`` largest batches that ran (the
regime nearest the limit), and the search does not trust it blindly: a prediction is
run only where it lies between the largest batch that fitted and the smallest that ran
out (or twice the former, while none ran out); otherwise the batch doubles, as a
batch-size finder does, and once one runs out the next try is halfway. The search stops
when the two are within ``STEP_SHARE`` of each other or ``MAX_CONFIRMS`` runs are spent;
the answer is always a batch that ran.

Which peak is compared with which limit (``memory_basis``):

* a CPU job under ``--memory-limit`` (RLIMIT_AS: the run's, or the sweep's own): the
  peak address space (``VmPeak``), what the limit caps;
* a CUDA job: the allocator's peak reserved bytes against the device's memory;
* otherwise there is no limit to fit under: the fit is reported, no batch is predicted.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stepscope.collectors.launch.memory_limit import MEMORY_LIMIT_KEY

STEP_SHARE = 0.05  # settled: the largest fit and the smallest miss within 5 % (or 1 sample)
MAX_CONFIRMS = 4  # runs spent after the sweep's batches (predictions, doublings, halves)
FIT_POINTS = 3  # the line is fitted to the largest batches that ran

VM_PEAK = "vm_peak_bytes"
CUDA_RESERVED = "cuda_reserved_bytes"
RSS = "rss_bytes"


def memory_basis(run: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """``{"key", "limit_bytes", "limit_source"}``: the peak of each trial to fit and the
    bytes it must stay under (None: no limit known). ``limit``: the sweep's own."""
    device = run.get("device") or {}
    on_cuda = bool(device.get("device_memory_bytes"))
    if on_cuda:
        return {
            "key": CUDA_RESERVED,
            "limit_bytes": int(device["device_memory_bytes"]),
            "limit_source": f"the GPU's memory ({device.get('device_name') or 'device'})",
        }
    recorded = (run.get("config") or {}).get(MEMORY_LIMIT_KEY)
    if limit or recorded:
        source = "--memory-limit of the sweep" if limit else "the run's --memory-limit"
        return {"key": VM_PEAK, "limit_bytes": int(limit or recorded), "limit_source": source}
    return {"key": RSS, "limit_bytes": None, "limit_source": None}


def trial_peak(run: dict[str, Any], key: str) -> float | None:
    """One trial's recorded peak of ``key`` (``collectors/facts/peak_memory.py``)."""
    value = ((run.get("config") or {}).get("peak_memory") or {}).get(key)
    return float(value) if isinstance(value, int | float) and value > 0 else None


def fit_peak(points: list[tuple[int, float]]) -> dict[str, float] | None:
    """Least squares ``peak = fixed + per_sample x batch`` over the (batch, peak) points
    of the ``FIT_POINTS`` largest batch sizes; None with fewer than two batch sizes."""
    largest = sorted({b for b, _ in points})[-FIT_POINTS:]
    if len(largest) < 2:
        return None
    points = [(b, p) for b, p in points if b in largest]
    sizes = np.array([b for b, _ in points], dtype=float)
    peaks = np.array([p for _, p in points], dtype=float)
    per_sample, fixed = np.polyfit(sizes, peaks, 1)
    residual = peaks - (fixed + per_sample * sizes)
    return {
        "fixed_bytes": float(fixed),
        "per_sample_bytes": float(per_sample),
        "max_residual_bytes": float(np.abs(residual).max()),
    }


def predict(fit: dict[str, float] | None, limit: int | None) -> int | None:
    """The largest batch the fitted line keeps under ``limit``; None where it cannot say
    (no fit, no limit, memory that does not grow with the batch)."""
    if fit is None or not limit or fit["per_sample_bytes"] <= 0:
        return None
    return max(0, math.floor((limit - fit["fixed_bytes"]) / fit["per_sample_bytes"]))


def settled(fits: int, runs_out: int | None) -> bool:
    """The largest batch that fitted and the smallest that ran out are a step apart."""
    return runs_out is not None and runs_out - fits <= max(1, math.ceil(STEP_SHARE * fits))


def next_size(predicted: int | None, fits: int, runs_out: int | None) -> int | None:
    """The batch to run next, between the largest that fitted (``fits``) and the smallest
    that ran out (``runs_out``, None: none did yet); None: settled.

    The prediction where it falls between the two (below twice ``fits`` while nothing
    ran out); else, while nothing ran out, twice ``fits``, as a batch-size finder
    doubles; else halfway."""
    if settled(fits, runs_out):
        return None
    upper = runs_out if runs_out is not None else 2 * fits
    if predicted is not None and fits < predicted < upper:
        return predicted
    return upper if runs_out is None else (fits + runs_out) // 2


def answer(
    rows: list[dict[str, Any]],
    basis: dict[str, Any],
    first_fit: dict[str, float] | None,
    fit: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The sweep's largest batch: the largest that ran, how it was found, and why.
    ``predicted`` is from ``first_fit`` (the sweep's own batches: what the bench holds
    against the batch found); ``fit`` is the line over every batch that ran, for the
    chart (default: the first)."""
    fit = fit or first_fit
    ran = [r for r in rows if r.get("status") == "completed" and r.get("batch_size")]
    best = max(ran, key=lambda r: r["batch_size"], default=None)
    misses = [r["batch_size"] for r in rows if r.get("failure") == "oom" and r.get("batch_size")]
    out_of_memory = [b for b in misses if best is None or b > best["batch_size"]]
    below = sorted(b for b in misses if best is not None and b < best["batch_size"])
    limit = basis["limit_bytes"]
    out: dict[str, Any] = {
        "batch_size": best["batch_size"] if best else None,
        "samples_per_s": best.get("samples_per_s") if best else None,
        "peak_bytes": best.get("peak_bytes") if best else None,
        "predicted": predict(first_fit, limit),
        "limit_bytes": limit,
        "limit_source": basis["limit_source"],
        "peak_key": basis["key"],
        "fit": fit,
        "smallest_out_of_memory": min(out_of_memory) if out_of_memory else None,
    }
    if below:
        out["note"] = (
            f"batch {below[0]} ran out of memory although batch {best['batch_size']} ran: "
            "this job's peak does not grow evenly with the batch (the CPU allocator's heap "
            "keeps what it held), so a batch near the limit may run out on one run and "
            "not on the next; leave a margin"
        )
    if best is None:
        out["why"] = "no batch size ran to its end"
    elif limit is None:
        out["why"] = (
            "no memory limit to fit under: record the run with --memory-limit SIZE, or give "
            "the sweep --memory-limit SIZE (a CPU job); a GPU job uses its device's memory"
        )
    elif out["smallest_out_of_memory"] is not None:
        out["why"] = (
            f"batch {best['batch_size']} ran under the limit and batch "
            f"{out['smallest_out_of_memory']} ran out of memory"
        )
        out["settled"] = settled(best["batch_size"], out["smallest_out_of_memory"])
        if not out["settled"]:
            out["why"] += f" (the batches between were not tried: {MAX_CONFIRMS} runs at most)"
    else:
        out["why"] = (
            f"batch {best['batch_size']} ran under the limit; no batch tried ran out "
            f"({MAX_CONFIRMS} runs at most: a larger one may fit)"
        )
    return out


__all__ = [
    "FIT_POINTS",
    "MAX_CONFIRMS",
    "STEP_SHARE",
    "answer",
    "fit_peak",
    "memory_basis",
    "next_size",
    "predict",
    "settled",
    "trial_peak",
]
