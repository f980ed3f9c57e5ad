"""A batch-size sweep's figures: per batch size, throughput and latency, and the knee.

Plain functions over the store's steps of each factor's trials (``sweep.py`` runs them),
so that the CLI, the dashboard and the stored result show the same numbers. Intervals
are percentile-bootstrap 95 % intervals over the pooled timed steps (1000 resamples,
a fixed seed: the same steps give the same interval).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope.analyzers.steps.latency import distribution
from stepscope.optim_runner.speedup.stats import sec_per_sample, timed_step_times

FIX_ID = "larger_batch"
KNEE_SHARE = 0.9  # the knee: the smallest batch within 10 % of the best throughput
BOOTSTRAP = 1000


def applied_batch(store: Any, runs: list[int]) -> int | None:
    """The batch size the job's DataLoader got, read back from ``config["applied"]``."""
    for run_id in runs:
        for entry in (store.run(run_id).get("config") or {}).get("applied") or []:
            if entry.get("fix") != FIX_ID or not entry.get("applied"):
                continue
            found = re.search(r"batch_size \d+ -> (\d+)", str(entry.get("change", "")))
            if found:
                return int(found.group(1))
    return None


def arm_figures(store: Any, runs: list[int], batch_size: int | None = None) -> dict[str, Any]:
    """Samples/s, p50 and p99 latency per batch (95 % bootstrap intervals) over the arm's
    trials, warm-up left out of each. ``batch_size``: the batch the arm asked for, taken
    for steps that do not know theirs (a job that makes its batches without a DataLoader,
    swept through its command line's batch flag)."""
    times, per_sample, batches = [], [], []
    for run_id in runs:
        steps = store.steps(run_id)
        if steps.empty:
            continue
        if batch_size and ("batch_size" not in steps or steps["batch_size"].isna().all()):
            steps = steps.assign(batch_size=float(batch_size))
        times.append(timed_step_times(steps))
        sps = sec_per_sample(steps)
        if sps is not None:
            per_sample.append(sps)
        batches.extend(steps["batch_size"].dropna().tolist())
    pooled = np.concatenate(times) if times else np.zeros(0)
    out: dict[str, Any] = {
        "batch_size": int(np.median(batches)) if batches else None,
        "steps": int(pooled.size),
        "samples_per_s": None,
        "samples_per_s_ci": None,
        "p50_s": None,
        "p50_ci": None,
        "p99_s": None,
        "p99_ci": None,
    }
    if pooled.size < 2:
        out["status"] = "failed"
        out["error"] = "too few timed steps (raise --steps)"
        return out
    dist = distribution(pooled)
    out["p50_s"], out["p99_s"] = round(dist["p50_s"], 6), round(dist["p99_s"], 6)
    out["p50_ci"] = _round(_bootstrap(pooled, lambda x: np.percentile(x, 50, axis=-1)))
    out["p99_ci"] = _round(_bootstrap(pooled, lambda x: np.percentile(x, 99, axis=-1)))
    if per_sample:
        sps = np.concatenate(per_sample)
        out["samples_per_s"] = round(1.0 / float(np.mean(sps)), 3)
        lo, hi = _bootstrap(sps, lambda x: np.mean(x, axis=-1))
        out["samples_per_s_ci"] = [round(1.0 / hi, 3), round(1.0 / lo, 3)]
    return out


def knee(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest batch whose throughput is within ``KNEE_SHARE`` of the best."""
    measured = [r for r in rows if r.get("samples_per_s")]
    if not measured:
        return None
    best = max(measured, key=lambda r: r["samples_per_s"])
    pick = min(
        (r for r in measured if r["samples_per_s"] >= KNEE_SHARE * best["samples_per_s"]),
        key=lambda r: r["factor"],
    )
    share = pick["samples_per_s"] / best["samples_per_s"]
    return {
        "factor": pick["factor"],
        "batch_size": pick.get("batch_size"),
        "samples_per_s": pick["samples_per_s"],
        "p99_s": pick.get("p99_s"),
        "best_factor": best["factor"],
        "why": f"batch {pick.get('batch_size')} gives {share:.0%} of the best throughput "
        f"(batch {best.get('batch_size')}, {best['samples_per_s']:.4g} samples/s)",
    }


def _bootstrap(values: np.ndarray, stat: Callable[[np.ndarray], Any]) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    draws = stat(values[rng.integers(0, values.size, size=(BOOTSTRAP, values.size))])
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(lo), float(hi)


def _round(pair: tuple[float, float]) -> list[float]:
    return [round(pair[0], 6), round(pair[1], 6)]


__all__ = ["FIX_ID", "KNEE_SHARE", "applied_batch", "arm_figures", "knee"]
