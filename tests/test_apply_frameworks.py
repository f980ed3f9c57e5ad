"""Fixes reach the objects Hugging Face's Trainer and Lightning build inside themselves.

Neither library lets the script touch its DataLoader or optimizer directly: the Trainer
builds `DataLoader(..., num_workers=args.dataloader_num_workers)` and wraps it in
accelerate's `DataLoaderShard` (which re-creates it), Lightning calls the module's
`train_dataloader()` and `configure_optimizers()`. The plan must still change them, and
the job's own objects must show it (``verified``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "corpus"
PLAN = {
    "fixes": {"dataloader_workers": {"num_workers": 2}, "fused_optimizer": {}},
    "seed": 0,
}


def _applied(
    home: Path, script: str, *args: str, max_steps: int | None = None
) -> tuple[dict, dict]:
    command = [sys.executable, str(CORPUS / script), *args]
    run_id, code = launch_run(
        command, home=home, quiet=True, plan=PLAN, output_path="out.log", max_steps=max_steps
    )
    assert code == 0
    with RunStore(home) as store:
        run = store.run(run_id)
        steps = store.steps(run_id)
    entries: dict[str, list[dict]] = {}
    for entry in run["config"]["applied"]:
        entries.setdefault(entry["fix"], []).append(entry)
    return entries, {"run": run, "steps": steps}


@pytest.mark.slow
def test_trainer_dataloader_and_optimizer_take_the_fixes(tmp_path: Path) -> None:
    entries, seen = _applied(tmp_path, "hf_trainer.py", "--max-steps", "4")
    workers = entries["dataloader_workers"]
    # TrainingArguments.dataloader_num_workers=0 is passed explicitly: replaced, verified
    assert workers[0]["applied"] and workers[0]["verified"], workers
    assert "(the job set 0)" in workers[0]["change"]
    assert all(ld["num_workers"] == 2 for ld in seen["run"]["facts"]["dataloaders"])
    # the Trainer's default optimizer is already AdamW(fused=True): replaced by the same
    fused = entries["fused_optimizer"]
    assert fused[0]["applied"] and fused[0]["verified"], fused
    assert fused[0]["change"].startswith("AdamW(fused=True")
    assert list(seen["steps"]["step"]) == [0, 1, 2, 3]


@pytest.mark.slow
def test_lightning_dataloader_and_optimizer_take_the_fixes(tmp_path: Path) -> None:
    entries, seen = _applied(tmp_path, "lightning_job.py", max_steps=6)
    workers = [e for e in entries["dataloader_workers"] if e["applied"]]
    assert workers and all(e["verified"] for e in workers), entries["dataloader_workers"]
    fused = entries["fused_optimizer"]
    assert fused[0]["applied"] and fused[0]["verified"] and fused[0]["change"].startswith("Adam(")
    assert list(seen["steps"]["step"]) == list(range(6))
