"""Batch sweep of a generation job: its own requests, batched, per batch size.

``stepscope optimize RUN --sweep batch`` on a generation run (steps of kind 'generate',
from ``generate()`` calls) runs the job once to record its first requests' prompts (the
*capture* trial), then, per batch size (default 1, 2, 4, 8, 16), trials in which the job
builds its model as it always does and then generates those prompts that many rows at a
time (``collectors/trials/generation_sweep.py``), interleaved in rounds as every experiment is.
Per batch size: tokens/s (new tokens over the summed batch latencies) with its ratio to
batch 1 and a bootstrap 95 % interval, request latency p50/p99 (a request waits for its
whole batch, so each row's latency is its batch's), and the share of generated tokens
identical to batch 1's answers, position by position (``token_guard``): left padding
with an attention mask keeps greedy answers the same, and the sweep shows where they are
not. The knee: the smallest batch within ``KNEE_SHARE`` of the best tokens/s.

A hand-written decode loop cannot be batched from outside (stepscope does not own its
loop); such a run is refused with one line saying what to change instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.analyzers.steps.generation import request_table
from stepscope.collectors.trials.generation_sweep import PROMPTS_KIND, RECORD_KEY, SWEEP_KEY
from stepscope.optim_runner.guards.token_guard import compare_tokens, load_tokens
from stepscope.optim_runner.speedup.stats import speedup_ci
from stepscope.optim_runner.sweeps.sweep_figures import KNEE_SHARE
from stepscope.optim_runner.trials.contention import contention
from stepscope.optim_runner.trials.trial_loop import (
    ExperimentError,
    Progress,
    TrialLoop,
    run_recorded,
)
from stepscope.optim_runner.trials.trials import Arm
from stepscope.store.artifacts import kind_files

SWEEP_KIND = "sweep"
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)
DEFAULT_PROMPTS = 16


def check_generation_sweepable(store: Any, run_id: int) -> dict[str, Any]:
    """The run, when its requests can be batched; else ValueError saying why."""
    run = store.run(run_id)
    requests = store.requests(run_id)
    sources = set(requests["source"]) if not requests.empty else set()
    if "generate" not in sources:
        raise ValueError(
            f"run {run_id}'s requests come from a hand-written decode loop: stepscope cannot "
            "batch them from outside; batch the prompts in the loop itself (a (rows, tokens) "
            "tensor with left padding and an attention mask)"
        )
    return run


def samples(requests: Any) -> bool:
    """Whether the job's generate() calls sample (``do_sample=True`` in a request's meta)."""
    if requests.empty or "meta" not in requests:
        return False
    return any(isinstance(m, dict) and m.get("do_sample") for m in requests["meta"])


def run_generation_sweep(
    store: Any,
    baseline_run_id: int,
    batch_sizes: list[int] | tuple[int, ...] = DEFAULT_BATCH_SIZES,
    prompts: int = DEFAULT_PROMPTS,
    trials: int = 1,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    *,
    seed: int | None = 0,
    experiment_id: int | None = None,
) -> dict[str, Any]:
    """Run the sweep in the foreground; returns its result (stored as the experiment's)."""
    base = check_generation_sweepable(store, baseline_run_id)
    sizes = sorted({int(b) for b in batch_sizes} | {1})
    config = {
        "kind": SWEEP_KIND,
        "sweep": "batch",
        "generation": True,
        "factors": sizes,
        "fixes": [],
        "steps": max(1, int(prompts)),
        "trials": max(1, int(trials)),
        "timeout_s": timeout_s,
        "seed": seed,
        "keep_explicit": False,
        "command": base["command"],
        "cwd": base["cwd"],
    }
    return run_recorded(
        store,
        baseline_run_id,
        config,
        experiment_id,
        lambda eid: _GenerationSweep(store, eid, base, config, progress),
    )


class _GenerationSweep(TrialLoop):
    """The capture trial, then an arm per batch size (batch 1 first: the reference)."""

    kind = SWEEP_KIND
    reference_failed = "the job failed at batch size 1"

    def __init__(
        self,
        store: Any,
        experiment_id: int,
        base: dict[str, Any],
        config: dict[str, Any],
        progress: Progress | None,
    ) -> None:
        self.sizes: list[int] = config["factors"]
        self.capture = Arm("capture", "baseline", [], plan={RECORD_KEY: config["steps"]})
        arms = [Arm(f"batch {b}", "baseline" if b == 1 else "alone", []) for b in self.sizes]
        super().__init__(store, experiment_id, base, config, progress, arms)
        self.total += 1  # the capture trial

    def _all_arms(self) -> list[Arm]:
        return [self.capture, *self.arms]

    def run(self) -> dict[str, Any]:
        self._trial(self.capture, 0, "capture")
        files = kind_files(
            self.store.artifacts(self.capture.runs[0]), self.store.home, PROMPTS_KIND
        )
        if not files:
            raise ExperimentError(
                f"the capture trial (run {self.capture.runs[0]}) recorded no prompts: "
                "did the job call generate()?"
            )
        for size, arm in zip(self.sizes, self.arms, strict=True):
            arm.plan = {SWEEP_KEY: {"batch_size": size, "prompts": str(files[0])}}
        self._rounds("sweep")
        reference = _arm_figures(self.store, self.arms[0].runs, None)
        rows = [self._row(b, a, reference) for b, a in zip(self.sizes, self.arms, strict=True)]
        sampling = samples(self.store.requests(self.base["id"]))
        return {
            "kind": SWEEP_KIND,
            "sweep": "batch",
            "generation": True,
            "experiment_id": self.id,
            "baseline_run": self.base["id"],
            "capture_run": self.capture.runs[0],
            "command": self.base["command"],
            "cwd": self.base["cwd"],
            "prompts": self.config["steps"],
            "trials": self.config["trials"],
            "factors": self.sizes,
            "arm_order": self.order,
            "rows": rows,
            "knee": generation_knee(rows),
            "knee_share": KNEE_SHARE,
            "sampling": sampling,
            "numerics": (
                "the job samples (do_sample=True): a batch draws other random numbers than "
                "one prompt at a time, so its answers differ by design; the token agreement "
                "is shown, not judged"
                if sampling
                else "batched greedy answers are compared with batch 1's token by token"
            ),
            "contention": contention([self.store.samples(r) for a in self.arms for r in a.runs]),
        }

    def _row(self, size: int, arm: Arm, reference: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"batch_size": size, "factor": size, "arm": arm.name,
                               "runs": list(arm.runs), "status": "completed", "error": arm.error}  # fmt: skip
        if arm.failed:
            row["status"] = "failed"
            return row
        figures = _arm_figures(self.store, arm.runs, reference)
        # the arrays kept for the comparison with batch 1 stay out of the result
        row.update({k: v for k, v in figures.items() if not k.startswith("_")})
        return row


def _arm_figures(store: Any, runs: list[int], reference: dict[str, Any] | None) -> dict[str, Any]:
    """tokens/s, request p50/p99 and, against ``reference`` (batch 1), the tokens/s ratio
    with its interval and the token agreement."""
    per_token, latencies, tokens, seconds = [], [], 0.0, 0.0
    answers = None
    for run_id in runs:
        table = request_table(store.requests(run_id))
        done = table[table["status"] == "done"]
        if done.empty:
            continue
        per_token.append((done["latency_s"] / done["new_tokens"].clip(lower=1)).to_numpy())
        latencies.append(
            np.repeat(done["latency_s"].to_numpy(), done["rows"].fillna(1).astype(int))
        )
        tokens += float(done["new_tokens"].sum())
        seconds += float(done["latency_s"].sum())
        answers = answers if answers is not None else load_tokens(store, run_id)
    out: dict[str, Any] = {"tokens_per_s": None, "speedup": None, "ci": None,
                           "request_p50_s": None, "request_p99_s": None, "token_agreement": None,
                           "first_divergence": None, "_per_token": None, "_answers": answers}  # fmt: skip
    if not per_token or seconds <= 0:
        out["status"], out["error"] = "failed", "no finished request"
        return out
    pooled = np.concatenate(latencies)
    out["tokens_per_s"] = round(tokens / seconds, 3)
    out["request_p50_s"] = round(float(np.percentile(pooled, 50)), 6)
    out["request_p99_s"] = round(float(np.percentile(pooled, 99)), 6)
    out["_per_token"] = np.concatenate(per_token)
    if reference is not None and reference.get("_per_token") is not None:
        try:
            ci = speedup_ci(reference["_per_token"], out["_per_token"], statistic="mean")
            out["speedup"] = round(out["tokens_per_s"] / reference["tokens_per_s"], 4)
            out["ci"] = [round(ci.lo, 4), round(ci.hi, 4)]
        except ValueError:
            pass  # fewer than two batches on a side: the ratio alone
        if answers is not None and reference.get("_answers") is not None:
            diff = compare_tokens(reference["_answers"], answers)
            out["token_agreement"] = round(diff.agreement, 6)
            firsts = [p for p in diff.first_divergence if p is not None]
            out["first_divergence"] = min(firsts) if firsts else None
    return out


def generation_knee(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The smallest batch within ``KNEE_SHARE`` of the best tokens/s."""
    measured = [r for r in rows if r.get("tokens_per_s")]
    if not measured:
        return None
    best = max(measured, key=lambda r: r["tokens_per_s"])
    pick = min(
        (r for r in measured if r["tokens_per_s"] >= KNEE_SHARE * best["tokens_per_s"]),
        key=lambda r: r["batch_size"],
    )
    share = pick["tokens_per_s"] / best["tokens_per_s"]
    return {
        "factor": pick["batch_size"],
        "batch_size": pick["batch_size"],
        "tokens_per_s": pick["tokens_per_s"],
        "p99_s": pick.get("request_p99_s"),
        "best_factor": best["batch_size"],
        "why": f"batch {pick['batch_size']} gives {share:.0%} of the best tokens/s "
        f"(batch {best['batch_size']}, {best['tokens_per_s']:.4g} tokens/s)",
    }


__all__ = [
    "DEFAULT_BATCH_SIZES",
    "check_generation_sweepable",
    "generation_knee",
    "run_generation_sweep",
]
