"""Judging an experiment's trials: ratios against the baseline, the fixes kept, notes.

Decisions, and why:

* **Ratios with intervals.** Each candidate's figure is the ratio of its pooled timed
  step times (and of samples/s) against the baseline's, with a bootstrap 95 % interval
  (``stats.speedup_ci``), and a quality guard on the losses (``quality``), or on the
  outputs for an inference job (``output_guard``).
* **Warm-up excluded per trial**, as on the run page (``timed_step_times``), and
  reported separately: worker start-up or compilation is a cost, but a one-off one.
* **Fixes that need another fix** (persistent workers need workers) are measured
  together with that fix, and their own gain is read against that fix alone.
* **Faster on both statistics.** Throughput says faster only where the median step
  agrees (its interval above 1 too; per sample when the batch size changed); when they
  part, the verdict is "disagree", with why (``agreement``: the baseline's slow steps
  weigh on its mean, or too few steps), and the fix is not kept. Inference arms get the
  same rule (their median step is the p50 latency); generation arms (tokens/s) do not.
* **What to keep.** A fix is a candidate for keeping when it is measurably faster (on
  both statistics) and keeps the loss. What is kept is the fastest measured candidate
  made only of such fixes (``pick_best``): the combination of all of them, or a single
  fix when it alone measured faster than the combination (compile + channels_last
  1.20x against channels_last alone 1.30x keeps channels_last).
* **Notes on the result.** A measured gain above its bound says which side the data
  say is off (``bound_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope import fixes as catalog
from stepscope.analyzers.rules.recommend import predict
from stepscope.analyzers.steps.generation import is_generation
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.optim_runner.guards.guard import guard_candidate
from stepscope.optim_runner.speedup.agreement import DISAGREE, check_agreement, ratio_ci
from stepscope.optim_runner.speedup.latency_compare import latency_ratios
from stepscope.optim_runner.speedup.stats import SpeedupCI, sec_per_sample, timed_step_times
from stepscope.optim_runner.trials.failures import not_applied_error
from stepscope.optim_runner.trials.plan import PlannedFix
from stepscope.optim_runner.trials.trials import Arm
from stepscope.optim_runner.verdict.bound_check import above_bound_note
from stepscope.optim_runner.verdict.peak_memory import peak_fields, trade_text

FASTER = "faster"
NOT_APPLIED = "not_applied"
NOT_RUN = "not run"  # an arm the adaptive design gave no trial (adaptive.between_alike)
NOT_RUN_ALONE = "not run alone"  # predicted to gain nothing alone (trials.candidate_arms)
NOT_RUN_ALONE_WHY = (
    "not run alone: its predicted bound is at most 1.00x, so it was measured only beside "
    "the other fixes (--full, or naming it with --fixes, runs it alone)"
)


# -- one arm's figures -------------------------------------------------------------------
@dataclass
class Figures:
    step_times: np.ndarray
    sec_per_sample: np.ndarray | None
    batch: float | None
    warmups: list[tuple[int, float | None]]

    @property
    def median_step(self) -> float | None:
        return round(float(np.median(self.step_times)), 6) if self.step_times.size else None

    @property
    def samples_per_s(self) -> float | None:
        if self.sec_per_sample is None or not self.sec_per_sample.size:
            return None
        return round(1.0 / float(np.mean(self.sec_per_sample)), 3)  # throughput: a mean

    def warmup(self) -> dict[str, Any]:
        """Warm-up excluded from the figures: steps per trial and mean time."""
        times = [t for _, t in self.warmups if t is not None]
        return {
            "steps": max((n for n, _ in self.warmups), default=0),
            "time_s": round(float(np.mean(times)), 4) if times else None,
        }


def figures(store: Any, runs: list[int]) -> Figures:
    """Timed step times of an arm's trials pooled; warm-up left out of each trial.

    A generation job's throughput is in tokens: each step (a request) counts its new
    tokens as its samples, so "samples/s" is tokens/s there."""
    times, per_sample, batches, warmups = [], [], [], []
    for run_id in runs:
        steps = store.steps(run_id)
        if steps.empty:
            continue
        if is_generation(steps):
            steps = tokens_as_samples(steps, store.requests(run_id))
        times.append(timed_step_times(steps))
        summary = summarize_steps(steps)
        warmups.append((summary["warmup_steps"], summary["warmup_time_s"]))
        per_sample.append(sec_per_sample(steps))
        if per_sample[-1] is not None:
            batches.append(float(steps["batch_size"].median()))
    pooled = np.concatenate(times) if times else np.zeros(0)
    sps = None
    if per_sample and all(p is not None for p in per_sample):
        sps = np.concatenate(per_sample)
    batch = float(np.median(batches)) if batches and len(batches) == len(times) else None
    return Figures(pooled, sps, batch, warmups)


def tokens_as_samples(steps: Any, requests: Any) -> Any:
    """A generation run's steps with each request's new tokens as its batch size (None
    where a step has no finished request: then throughput is not compared)."""
    if requests is None or requests.empty:
        return steps.assign(batch_size=None)
    done = requests[requests["status"] == "done"].dropna(subset=["step"])
    tokens = {
        (int(r), int(s)): n
        for r, s, n in zip(done["rank"], done["step"], done["new_tokens"], strict=True)
    }
    counts = [
        tokens.get((int(r), int(s))) for r, s in zip(steps["rank"], steps["step"], strict=True)
    ]
    return steps.assign(batch_size=counts)


def _ci_json(
    ci: SpeedupCI | None, median: float | None = None, base_median: float | None = None
) -> dict[str, Any] | None:
    if ci is None:
        return None
    out = {
        "ratio": round(ci.ratio, 4),
        "ci": [round(ci.lo, 4), round(ci.hi, 4)],
        "verdict": ci.verdict,
        "n": [ci.n_baseline, ci.n_candidate],
        "text": ci.describe(),
    }
    if median is not None:
        out["median_s"] = median
        out["baseline_median_s"] = base_median
    return out


# -- a candidate against the baseline ----------------------------------------------------
def evaluate(
    store: Any,
    arm: Arm,
    baseline: Arm,
    tolerance: float,
    against: Arm | None = None,
    limits: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A candidate's figures against ``against`` (default: the baseline).

    The guard is on the outputs for an inference job (``limits``: its
    ``output_tolerance``/``min_agreement``), on the losses otherwise.
    """
    ref = against or baseline
    out: dict[str, Any] = {
        "name": arm.name,
        "kind": arm.kind,
        "fixes": arm.fix_ids,
        "status": "failed" if arm.failed else "completed",
        "error": arm.error,
        "failure": arm.failure,
        "failed_run": arm.failed_run,
        "runs": list(arm.runs),
        "against": ref.name,
        "speedup": None,
        "ci": None,
        "verdict": None,
        "speedup_basis": None,
        "step_time": None,
        "samples_per_s": None,
        "quality_ok": None,
        "quality": None,
        "warmup": None,
        "not_applied": list(arm.not_applied),
        "latency": None,  # inference arms: p50/p99 ratios (latency_compare.py)
        "agreement": None,  # the median checked against the throughput (agreement.py)
        "peak_bytes": None,  # median peak memory of its trials (peak_memory.py)
        "peak_ratio": None,  # to the baseline's (< 1: lower)
        "peak_basis": None,
        "trade": None,  # "peak 0.41x, 1.27x slower per sample"
    }
    if arm.not_applied and arm.error is None:
        out["status"] = NOT_APPLIED
        out["error"] = not_applied_error(arm.not_applied)
        return out
    if arm.failed:
        return out
    if not arm.runs:  # the adaptive design did not run it (``arm.stopped`` says why)
        out["status"] = NOT_RUN
        return out
    cand, base = figures(store, arm.runs), figures(store, ref.runs)
    out["warmup"] = cand.warmup()
    step_ci = ratio_ci(base.step_times, cand.step_times)
    # samples/s is throughput: a ratio of means (see stats.py)
    sps_ci = ratio_ci(base.sec_per_sample, cand.sec_per_sample, statistic="mean")
    out["step_time"] = _ci_json(step_ci, cand.median_step, base.median_step)
    out["samples_per_s"] = _ci_json(sps_ci)
    out["latency"] = latency_ratios(store, ref.runs, base.step_times, cand.step_times)
    # The verdict is on throughput (samples/s) whenever batch sizes are known: it is
    # what the job's wall time follows, what the Amdahl bound bounds, and the only
    # comparable figure when a fix changes the batch size. The median step-time
    # ratio is reported beside it, and must agree for "faster" (agreement.py).
    headline, basis = step_ci, "step_time"
    if sps_ci is not None:
        generation = is_generation(store.steps(ref.runs[0])) if ref.runs else False
        headline, basis = sps_ci, "tokens_per_s" if generation else "samples_per_s"
    if headline is None:
        out["status"] = "failed"
        out["error"] = "too few timed steps to compare (raise --steps)"
        return out
    out.update(
        speedup=round(headline.ratio, 4),
        ci=[round(headline.lo, 4), round(headline.hi, 4)],
        verdict=headline.verdict,
        speedup_basis=basis,
    )
    if basis == "samples_per_s":  # faster on throughput and on the median, or not faster
        agreement = check_agreement(headline, step_ci, base, cand)
        out["agreement"] = agreement.to_json()
        out["verdict"] = headline.verdict if agreement.agrees else DISAGREE
    out.update(peak_fields(store, arm.runs, ref.runs))
    out["trade"] = trade_text(out)
    lossless = all(not catalog.get(f).changes_numerics for f in arm.fix_ids if f in catalog.FIXES)
    quality = guard_candidate(store, baseline.runs, arm.runs, tolerance, limits, lossless)
    out["quality_ok"] = quality.ok
    out["quality"] = quality.to_json()
    return out


# -- each fix: predicted, measured, kept -------------------------------------------------
def per_fix(
    store: Any,
    planned: list[PlannedFix],
    candidates: list[Arm],
    outcomes: dict[str, dict[str, Any]],
    baseline: Arm,
    tolerance: float,
) -> dict[str, dict[str, Any]]:
    """Predicted vs measured for each fix, and whether it is kept."""
    by_fixes = {tuple(sorted(a.fix_ids)): a for a in candidates}
    out: dict[str, dict[str, Any]] = {}
    for fix in planned:
        own = by_fixes.get(tuple(sorted([fix.id] + ([fix.needs] if fix.needs else []))))
        outcome = outcomes.get(own.name) if own is not None else None
        measured: dict[str, Any] = dict.fromkeys(("speedup", "ci", "verdict", "agreement"))
        against = "baseline"
        if outcome is not None and fix.needs:
            # its own gain: over the fix it needs, run alone
            need_arm = by_fixes.get((fix.needs,))
            if (
                need_arm is not None
                and not need_arm.failed
                and outcome["status"] not in ("failed", NOT_RUN)
            ):
                marginal = evaluate(store, own, baseline, tolerance, against=need_arm)
                measured = _pick(marginal)
                against = fix.needs
        elif outcome is not None:
            measured = _pick(outcome)
        quality_ok = outcome["quality_ok"] if outcome else None
        status = outcome["status"] if outcome else "not measured"
        not_run_why = outcome.get("stopped") if status == NOT_RUN else None
        if own is None and fix.gains_nothing and len(planned) > 1:
            status, not_run_why = NOT_RUN_ALONE, NOT_RUN_ALONE_WHY
        why_not = None
        if status == NOT_APPLIED:
            status = "not applied"
            why_not = "; ".join(
                x["why"] for x in outcome["not_applied"] if x["fix"] == fix.id
            ) or "; ".join(f"{x['fix']}: {x['why']}" for x in outcome["not_applied"])
        kept = status == "completed" and measured["verdict"] == FASTER and quality_ok is not False
        out[fix.id] = {
            "id": fix.id,
            "params": fix.params,
            "why_params": fix.why_params,
            "predicted": fix.predicted_speedup,
            "predicted_basis": fix.basis,
            **_predicted_here(store, fix, baseline.runs),
            "finding": fix.finding,
            "measured": measured["speedup"],
            "ci": measured["ci"],
            "verdict": measured["verdict"],
            "against": against,
            "candidate": own.name if own is not None else None,
            "status": status,
            "error": outcome["error"] if outcome else None,
            "quality_ok": quality_ok,
            "changes_numerics": fix.changes_numerics,
            "kept": kept,
            "not_applied_why": why_not,
            "disagreement": _disagreement(measured),
            # why the adaptive design gave its arm no trial
            "not_run_why": not_run_why,
            "note": None,
        }
    for fix in planned:  # a fix is only worth what the fix it needs is worth
        if fix.needs and not out[fix.needs]["kept"]:
            out[fix.id]["kept"] = False
    return out


def _predicted_here(store: Any, fix: PlannedFix, baseline_runs: list[int]) -> dict[str, Any]:
    """The bound again, from this experiment's own baseline trials.

    The diagnosed run may have been recorded under other load: on a shared 2-core
    machine its data-wait share was 54 % while the interleaved baseline trials
    waited 80 %, and the measured 4.4x then "beat" a 2.2x bound. The step timer
    measures data wait on every trial, so input-pipeline fixes get a bound from the
    same conditions the measurement had; the others keep the diagnosis' bound.
    """
    if fix.finding != "io/input_pipeline":
        return {"predicted_in_experiment": None, "predicted_in_experiment_basis": None}
    shares = [
        summarize_steps(steps)["data_wait_share"]
        for steps in (store.steps(r) for r in baseline_runs)
        if not steps.empty
    ]
    shares = [x for x in shares if x is not None]
    if not shares:
        return {"predicted_in_experiment": None, "predicted_in_experiment_basis": None}
    bound, basis = predict(catalog.get(fix.id), float(np.median(shares)))
    return {
        "predicted_in_experiment": bound,
        "predicted_in_experiment_basis": f"{basis} (data wait of the baseline trials)",
    }


def annotate(
    store: Any,
    per_fix: dict[str, dict[str, Any]],
    best: dict[str, Any],
    baseline_runs: list[int],
    diagnosed_run_id: int,
) -> None:
    """Kept means in the best candidate; notes for what the figures alone hide."""
    chosen = set(best["fixes"])
    trials = figures(store, baseline_runs).median_step
    diagnosed = summarize_steps(store.steps(diagnosed_run_id))["step_time_median_s"]
    for entry in per_fix.values():
        notes = [
            x
            for x in (entry.get("disagreement"), entry.get("not_run_why"), entry.get("loo_note"))
            if x
        ]
        if entry["kept"] and entry["id"] not in chosen:
            entry["kept"] = False
            notes.append(
                f"faster on its own ({entry['measured']:.2f}x) but the best measured "
                f"candidate is {best['candidate']} ({best['speedup']:.2f}x)"
            )
        bound = above_bound_note(entry, trials, diagnosed)
        if bound:
            notes.append(bound)
        entry["note"] = "; ".join(notes) or None


# -- the best candidate ------------------------------------------------------------------
def pick_best(outcomes: list[dict[str, Any]], kept: set[str]) -> dict[str, Any] | None:
    """The fastest candidate that completed, measured faster, kept the loss and is made
    only of ``kept`` fixes; None when there is none."""
    pool = [
        o
        for o in outcomes
        if set(o["fixes"]) <= kept
        and o["status"] == "completed"
        and o["verdict"] == FASTER
        and o["quality_ok"] is not False
    ]
    return max(pool, key=lambda o: o["speedup"]) if pool else None


def no_best() -> dict[str, Any]:
    return {"fixes": [], "speedup": None, "ci": None, "verdict": None, "candidate": None}


def _pick(outcome: dict[str, Any]) -> dict[str, Any]:
    return {k: outcome.get(k) for k in ("speedup", "ci", "verdict", "agreement")}


def _disagreement(measured: dict[str, Any]) -> str | None:
    """Why a fix faster on throughput is not kept: its median step disagrees."""
    return (
        (measured.get("agreement") or {}).get("text") if measured["verdict"] == DISAGREE else None
    )


def best_from(fixes: list[str], outcome: dict[str, Any], confirmed: bool) -> dict[str, Any]:
    return {
        "fixes": list(fixes),
        "speedup": outcome["speedup"],
        "ci": outcome["ci"],
        "verdict": outcome["verdict"],
        "candidate": outcome["name"],
        "confirmed": confirmed,
    }


__all__ = [
    "DISAGREE",
    "FASTER",
    "NOT_APPLIED",
    "NOT_RUN",
    "Figures",
    "annotate",
    "best_from",
    "evaluate",
    "figures",
    "no_best",
    "per_fix",
    "pick_best",
]
