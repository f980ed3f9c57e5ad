"""Did a trial's fixes take effect? Read from what the job itself reported.

The bootstrap writes one entry per change into the trial run's ``config["applied"]``
(``optim_runner/apply.py``): the fix, the change, whether it was applied and whether
the job's own object read back the new value (``verified``). A candidate whose fix did
not take effect has measured the baseline again; its figures would be reported as
"no change" or worse, "slower" (a real script's ``num_workers=args.workers`` kept at 0
was once reported 0.96x). So such a candidate is "not applied", with the reason, and
never measured.
"""

from __future__ import annotations

from typing import Any

from stepscope.optim_runner.plan import ENV_FIXES

# What a fix changes, for "the job never created ...": a fix with no entry at all
# found nothing to act on.
TARGETS = {
    "dataloader_workers": "a DataLoader (the job feeds its model without one)",
    "persistent_workers": "a DataLoader with workers",
    "prefetch_factor": "a DataLoader with workers",
    "pin_memory": "a DataLoader",
    "larger_batch": "a DataLoader with a batch size",
    "fused_optimizer": "a torch.optim optimizer with foreach/fused options",
    "bf16_autocast": "a model called at top level",
    "torch_compile": "a model called at top level",
    "channels_last": "a model with Conv2d layers",
    "ddp_bucket_cap": "a DistributedDataParallel model",
    "ddp_gradient_as_bucket_view": "a DistributedDataParallel model",
    "ddp_static_graph": "a DistributedDataParallel model",
    "ddp_bf16_compression": "a DistributedDataParallel model",
}


def not_applied(fix_ids: list[str], config: dict[str, Any] | None) -> list[dict[str, str]]:
    """``[{"fix", "why"}]`` for each of ``fix_ids`` that did not take effect in the run."""
    entries = [e for e in ((config or {}).get("applied") or []) if isinstance(e, dict)]
    out = []
    for fix_id in fix_ids:
        if fix_id in ENV_FIXES:
            continue  # set in the job's environment by the runner itself
        mine = [e for e in entries if e.get("fix") == fix_id]
        if any(e.get("applied") and e.get("verified") is not False for e in mine):
            continue
        refused = [str(e.get("change", "")) for e in mine if not e.get("applied")]
        unverified = [str(e.get("change", "")) for e in mine if e.get("applied")]
        if refused:
            why = "; ".join(_strip(r) for r in dict.fromkeys(refused))
        elif unverified:
            why = f"set ({unverified[0]}), but the job's object did not show it"
        else:
            why = f"the job never created {TARGETS.get(fix_id, 'what this fix changes')}"
        out.append({"fix": fix_id, "why": why})
    return out


def _strip(change: str) -> str:
    return change.removeprefix("not applied: ")


__all__ = ["TARGETS", "not_applied"]
