"""Which fixes an experiment tries on a run, and with which parameters.

The diagnosis says *what* to fix; applying a fix needs numbers (how many DataLoader
workers, how many threads), and the right numbers depend on the job. They are chosen
here from what the baseline run recorded, with the reason kept beside each value so
the report can say why 4 workers and not 2. The experiment then measures whether the
choice pays; nothing here claims a gain.

Decisions, and why:

* **Which fixes.** The ``auto`` fixes the run's findings recommend (the saved findings,
  or a fresh diagnosis when the run was never diagnosed). A fix that changes what the
  model computes (bf16 autocast, TF32, a larger batch: ``Fix.needs_consent``) is left
  out unless the user allows numerics to change: a faster but different result is the
  user's call, asked before, not found out from the quality guard afterwards.
* **Parameters.** Each fix chooses its own (``Fix.choose_params``: workers in
  ``fixes/catalog/dataloader_workers.py``, threads in ``fixes/catalog/cpu_threads.py``, ...) from the
  context built here (``PlanContext``): the cores the job may use, what its loader waits
  on (``loader_wait``, below), the settings it reported, the diagnosis's advice.
* **Out of memory.** On a run that ran out of memory only the fixes that free memory
  (``memory_fixes``) are tried by default: the experiment asks which of them fit.
* **Seed.** Every arm of an experiment gets the same seed, so that losses can be
  compared step by step by the quality guard.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stepscope import fixes as catalog
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.fixes.catalog.dataloader_workers import LOADER_BUSY_PERCENT, choose_num_workers
from stepscope.types import FixAdvice, gains_nothing

# A loading process that uses less than 60 % of the CPU the model's work gets beside it
# is waiting (with LOADER_BUSY_PERCENT: below half a core per loading process).
WAIT_TO_WORK_RATIO = 0.6
# Regression of CPU on data-wait share needs windows that differ in their wait share.
MIN_WINDOWS = 4
MIN_WAIT_SPREAD = 0.05


@dataclass
class PlannedFix:
    """One fix an experiment tries, with its parameters and the diagnosis's prediction."""

    id: str
    params: dict[str, Any] = field(default_factory=dict)
    why_params: str = ""
    predicted_speedup: float | None = None  # upper bound from the finding's share
    basis: str | None = None
    finding: str | None = None  # 'class/subtype' of the finding that recommended it
    changes_numerics: bool = False
    needs_consent: bool = False
    needs: str | None = None  # a fix of the same plan it needs to do anything

    @property
    def gains_nothing(self) -> bool:
        """Predicted at 1.00x or less: it runs alone only under ``--full``."""
        return gains_nothing(self.predicted_speedup)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "params": self.params,
            "why_params": self.why_params,
            "predicted_speedup": self.predicted_speedup,
            "basis": self.basis,
            "finding": self.finding,
            "changes_numerics": self.changes_numerics,
            "needs_consent": self.needs_consent,
            "needs": self.needs,
        }


@dataclass(frozen=True)
class LoaderWait:
    """What the loop waits on when it waits for data: 'io', 'cpu' or 'unknown'."""

    kind: str
    cpu_percent: float | None  # the process tree's CPU while the loop waits
    basis: str


# -- which fixes -------------------------------------------------------------------------
def recommended(store: Any, run_id: int) -> list[FixAdvice]:
    """The run's recommended fixes over all findings, one entry per fix id.

    A fix recommended by several findings keeps its highest predicted bound (the most
    it could give) and names that finding (``FixAdvice.finding``).
    """
    findings = store.findings(run_id)
    if not findings:
        diagnose_run(store, run_id)
        findings = store.findings(run_id)
    best: dict[str, FixAdvice] = {}
    for finding in findings:
        for fix in finding.fixes:
            entry = dataclasses.replace(fix, finding=finding.key)
            known = best.get(fix.id)
            if known is None or (entry.predicted_speedup or 0) > (known.predicted_speedup or 0):
                best[fix.id] = entry
    return list(best.values())


# The finding a fix must address to be tried on a run that ran out of memory.
CAPACITY = "memory/capacity"

# The fix a draft model is for (``choose_fixes``'s ``draft_model``).
DRAFT_FIX = "speculative_decoding"


def choose_fixes(
    store: Any,
    run_id: int,
    fix_ids: list[str] | None = None,
    allow_numerics: bool = False,
    draft_model: str | None = None,
) -> list[PlannedFix]:
    """The fixes to try on ``run_id`` with their parameters.

    ``fix_ids``: the user's choice (validated against the catalog: an unknown id, a fix
    that needs a code change, or one that needs consent without ``allow_numerics`` is a
    ValueError); by default the recommended auto fixes. ``draft_model``: a smaller model
    sharing the tokenizer (``--draft-model PATH``): speculative decoding is tried with it.
    """
    recs = {r.id: r for r in recommended(store, run_id)}
    if fix_ids is None:
        ids = [r.id for r in recs.values() if r.auto and (allow_numerics or not r.needs_consent)]
    else:
        ids = list(dict.fromkeys(fix_ids))
        for fix_id in ids:
            try:
                fix = catalog.get(fix_id)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
            if not fix.auto:
                raise ValueError(f"{fix_id} is advice only (it needs a change to the code)")
            if fix.needs_consent and not allow_numerics:
                raise ValueError(
                    f"{fix_id} changes what the model computes; allow it explicitly "
                    "(--allow-numerics)"
                )
    if draft_model is not None:
        if not os.path.exists(draft_model):
            raise ValueError(f"--draft-model {draft_model}: no such file or folder")
        ids = list(dict.fromkeys([*ids, DRAFT_FIX]))
    run = store.run(run_id)
    context = PlanContext(store, run_id, run, ids, recs)
    context.draft_model = draft_model
    planned = []
    for fix_id in ids:
        fix = catalog.get(fix_id)
        rec = recs.get(fix_id)
        finding = rec.finding if rec else None
        params, why = fix.params_for(context, finding)
        needs = fix.needs
        planned.append(
            PlannedFix(
                id=fix_id,
                params=params,
                why_params=why,
                predicted_speedup=rec.predicted_speedup if rec else None,
                basis=rec.basis if rec else None,
                finding=finding,
                changes_numerics=fix.changes_numerics,
                needs_consent=fix.needs_consent,
                needs=needs if needs in ids and not context.loader_has_workers else None,
            )
        )
    return planned


def memory_fixes(planned: list[PlannedFix]) -> list[PlannedFix]:
    """The planned fixes that free memory (they address ``memory/capacity``), with the
    fixes they need; all of ``planned`` when none does. For a run that ran out of memory:
    a speed fix cannot make it fit, and its arms would only run out again."""
    by_id = {f.id: f for f in planned}
    keep = {f.id for f in planned if CAPACITY in catalog.get(f.id).addresses}
    keep |= {need for f in keep if (need := by_id[f].needs) is not None}
    chosen = [f for f in planned if f.id in keep]
    return chosen or planned


# -- parameters --------------------------------------------------------------------------
class PlanContext:
    """What the fixes' parameter choices read about the run (``Fix.choose_params``),
    computed once and only if needed."""

    def __init__(
        self,
        store: Any,
        run_id: int,
        run: dict[str, Any],
        ids: list[str],
        recs: dict[str, FixAdvice],
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.run = run
        self.ids = ids  # the fixes of this plan
        self._recs = recs
        self.cores = job_cores(run)
        loaders = (run.get("facts") or {}).get("dataloaders") or []
        self.loader_workers = max((int(ld.get("num_workers") or 0) for ld in loaders), default=0)
        self.loader_has_workers = self.loader_workers > 0
        self.settings: dict[str, Any] = (run.get("facts") or {}).get("settings") or {}
        self._wait: LoaderWait | None = None
        self.draft_model: str | None = None  # ``--draft-model`` (speculative decoding)

    @property
    def wait(self) -> LoaderWait:
        if self._wait is None:
            self._wait = loader_wait(
                self.store.steps(self.run_id),
                self.store.samples(self.run_id),
                max(1, self.loader_workers),
            )
        return self._wait

    def planned_workers(self) -> int:
        return choose_num_workers(self.cores, self.wait.kind)

    def advice(self, fix_id: str) -> FixAdvice | None:
        """The diagnosis's advice for this fix (its values to try), if it gave one."""
        return self._recs.get(fix_id)


def job_cores(run: dict[str, Any]) -> int:
    """Cores the job may use: its CPU affinity when recorded, else the machine's count."""
    env = run.get("env") or {}
    device = run.get("device") or {}
    for value in (env.get("cpu_affinity"), device.get("cpu_count"), env.get("cpu_count")):
        if value:
            return int(value)
    return os.cpu_count() or 1


# -- I/O or CPU: what the loop waits on --------------------------------------------------
def loader_wait(steps: pd.DataFrame, samples: pd.DataFrame, loaders: int = 1) -> LoaderWait:
    """Is the data the loop waits for held up by CPU work or by waiting (I/O, latency)?

    The step timer says how long each step waited for data; the sampler says how busy
    the process tree was over each sampling window (the CPU it asked for, where the
    sampler could read its run-queue waits). Regressing the CPU of each window on
    the share of it spent waiting for data gives the CPU while waiting (the fit at a
    share of 1), and the CPU while computing (at 0). Loading is waiting when it uses
    less than half a core per loading process (``loaders``: the main process, or the
    workers) *and* clearly less than the model's own work does: on a contended machine
    a CPU-bound loader gets less than a core, but no less than the model beside it.
    Without enough windows, a run that waits most of its time while using less than
    half a core is waiting too.
    """
    metric = _cpu_metric(samples)
    fit = _cpu_fit(steps, samples, metric)
    if fit is not None:
        cpu, computing = fit
        per_loader = cpu / max(1, loaders)
        waiting = per_loader < LOADER_BUSY_PERCENT and cpu < WAIT_TO_WORK_RATIO * computing
        kind = "io" if waiting else "cpu"
        what = "waiting (I/O, latency)" if kind == "io" else "CPU work"
        verb = "asked for" if metric == "cpu_demand_percent" else "used"
        basis = (
            f"the process tree {verb} {cpu:.0f} % CPU while the loop waited for data, "
            f"so the loading is {what}"
        )
        return LoaderWait(kind, cpu, basis)
    if steps.empty or samples.empty:
        return LoaderWait("unknown", None, "no step or CPU samples to tell I/O from CPU work")
    times = (steps["end_s"] - steps["start_s"]).sum()
    wait_share = float(steps["data_wait_s"].fillna(0).sum() / times) if times > 0 else 0.0
    proc = samples[(samples["scope"] == "proc") & (samples["metric"] == metric)]
    mean_cpu = float(proc["value"].mean()) if len(proc) else math.nan
    if wait_share >= 0.5 and mean_cpu < LOADER_BUSY_PERCENT:
        basis = f"the loop waits {wait_share:.0%} of the time at {mean_cpu:.0f} % CPU"
        return LoaderWait("io", None, basis)
    return LoaderWait("unknown", None, "too few samples to tell I/O from CPU work")


def _cpu_metric(samples: pd.DataFrame) -> str:
    """The CPU the tree asked for (got, plus waited for a core) where the sampler could
    read it: on a machine shared with other work a CPU-bound loader gets less than a
    core and would pass for one that waits on I/O."""
    if samples.empty or not (samples["metric"] == "cpu_demand_percent").any():
        return "cpu_percent"
    return "cpu_demand_percent"


def _cpu_fit(
    steps: pd.DataFrame, samples: pd.DataFrame, metric: str = "cpu_percent"
) -> tuple[float, float] | None:
    """CPU % of the process tree (waiting for data, computing); None when it cannot be fit.

    A step waits for data at its start (the loader is asked for the next batch right
    after the previous optimizer step), so the wait interval of each step is taken as
    [start, start + data_wait]. Rank 0's steps stand for the job.
    """
    if steps.empty or samples.empty or "data_wait_s" not in steps:
        return None
    rank0 = steps[steps["rank"] == steps["rank"].min()].sort_values("step")
    wait_start = rank0["start_s"].to_numpy(dtype=float)
    wait_end = wait_start + rank0["data_wait_s"].fillna(0.0).to_numpy(dtype=float)
    first, last = float(rank0["end_s"].iloc[0]), float(rank0["end_s"].iloc[-1])
    proc = samples[(samples["scope"] == "proc") & (samples["metric"] == metric)]
    proc = proc.dropna(subset=["value"]).sort_values("t")
    t = proc["t"].to_numpy(dtype=float)
    cpu = proc["value"].to_numpy(dtype=float)
    shares, values = [], []
    for i in range(1, len(t)):
        lo, hi = t[i - 1], t[i]
        if lo < first or hi > last or hi <= lo:
            continue  # start-up (imports) and shut-down are not loading
        overlap = np.clip(np.minimum(wait_end, hi) - np.maximum(wait_start, lo), 0.0, None)
        shares.append(float(overlap.sum()) / (hi - lo))
        values.append(cpu[i])
    if len(shares) < MIN_WINDOWS or float(np.std(shares)) < MIN_WAIT_SPREAD:
        return None
    slope, intercept = np.polyfit(np.asarray(shares), np.asarray(values), 1)
    return max(0.0, float(intercept + slope)), max(0.0, float(intercept))


# -- what the job gets -------------------------------------------------------------------
def plan_document(
    fixes: list[PlannedFix],
    seed: int | None = 0,
    override_explicit: bool = True,
    record_outputs: int | None = None,
) -> dict[str, Any]:
    """The plan file for one arm (shape: ``collectors/launch/contract.py``).

    ``override_explicit``: a fix replaces a value the script set itself (the user asked
    to try the fix); False keeps the script's values (``--keep-explicit``). Fixes
    applied through the environment are left out: the bootstrap cannot apply them.
    ``record_outputs``: keep the model's first N outputs (inference jobs: the output
    guard compares them; ``collectors/trials/output_record.py``).
    """
    doc: dict[str, Any] = {
        "fixes": {f.id: dict(f.params) for f in fixes if catalog.get(f.id).env is None},
        "override_explicit": override_explicit,
        "seed": seed,
    }
    if record_outputs:
        doc["record_outputs"] = int(record_outputs)
    return doc


def plan_env(fixes: list[PlannedFix], base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables an arm's job needs for the fixes applied through its environment.

    A setting the job already has (``base``: e.g. its own PYTORCH_CUDA_ALLOC_CONF) is
    kept, and the fix's option appended to it.
    """
    base = base or {}
    env: dict[str, str] = {}
    for fix in fixes:
        env_fix = catalog.get(fix.id).env
        if env_fix is None:
            continue
        name, option = env_fix
        current = env.get(name, base.get(name, ""))
        key = option.split(":")[0]
        kept = [o for o in current.split(",") if o and o.split(":")[0] != key]
        env[name] = ",".join([*kept, option])
    return env


__all__ = [
    "LoaderWait",
    "PlanContext",
    "PlannedFix",
    "choose_fixes",
    "loader_wait",
    "memory_fixes",
    "plan_document",
    "plan_env",
    "recommended",
]
