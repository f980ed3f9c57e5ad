"""The inference fixes measured side by side: inference_mode and int8 dynamic quantisation.

    python bench/inference.py                       # both examples, 3 trials x 20 steps
    python bench/inference.py --trials 4 --steps 30 --json bench/results/inference.json

For each pair, ``stepscope run`` records the example once, the diagnosis says what it
found first, and ``run_experiment`` (what ``stepscope optimize`` runs) re-runs it as a
baseline interleaved with the candidate (A B A B ...), the same steps and seed in each
trial: the speed-up is the ratio of mean seconds per sample with its bootstrap 95 %
interval, and the candidate's outputs are compared with the baseline's on the same
seeded inputs (the output guard: top-1 agreement for a classifier).

* ``examples/inference_no_inference_mode.py`` with ``inference_mode`` (numerics
  unchanged; the finding the diagnosis should put first);
* ``examples/text_classifier_int8.py`` with ``int8_dynamic_quant`` (changes numerics:
  run with ``allow_numerics``, as ``--allow-numerics`` does).

A speed-up measured here is this machine's: on a shared 2-core VM the interval widens
with the load, which the contention line reports. ``--threads`` (default 1) sets
``OMP_NUM_THREADS`` for the recorded run, which the trials replay: with other work on
the cores, two intra-op threads wait on each other at every operator's barrier and the
ratio measures the contention more than the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.experiment.experiment import ExperimentOptions, run_experiment
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
PAIRS = (
    ("inference_no_inference_mode.py", "inference_mode", False),
    ("text_classifier_int8.py", "int8_dynamic_quant", True),
)


def one(home: Path, script: str, fix: str, numerics: bool, steps: int, trials: int) -> dict:
    """Record the example, diagnose it, and measure the fix against it."""
    command = [sys.executable, str(REPO / "examples" / script), "--steps", str(2 * steps)]
    run_id, code = launch_run(command, home=home, quiet=True, cwd=REPO)
    row: dict[str, Any] = {"example": script, "fix": fix, "run": run_id, "exit_code": code}
    with RunStore(home) as store:
        diagnosis = diagnose_run(store, run_id)
        row["first_finding"] = diagnosis.findings[0].key if diagnosis.findings else None
        row["findings"] = [f.key for f in diagnosis.findings]
        options = ExperimentOptions(
            fixes=(fix,), steps=steps, trials=trials, allow_numerics=numerics
        )
        result = run_experiment(store, run_id, options)
    (measured,) = [f for f in result["fixes"] if f["id"] == fix]
    arm = next(c for c in result["candidates"] if c["fixes"] == [fix])
    row.update(
        speedup=measured["measured"],
        ci=measured["ci"],
        verdict=measured["verdict"],
        status=measured["status"],
        error=measured["error"],
        guard=result.get("guard"),
        quality_ok=measured["quality_ok"],
        quality=arm.get("quality"),
        step_time=arm.get("step_time"),
        contention=(result.get("contention") or {}).get("warning"),
    )
    return row


def describe(row: dict[str, Any]) -> str:
    ci = row["ci"]
    speed = f"{row['speedup']:.2f}x (95 % CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else "not measured"
    quality = row.get("quality") or {}
    guard = f"{row['guard']} guard ok={row['quality_ok']}"
    if quality.get("agreement") is not None:
        guard += f", top-1 agreement {quality['agreement']:.4f}"
    if quality.get("max_abs_diff") is not None:
        guard += f", max abs diff {quality['max_abs_diff']:.3g}"
    lines = [
        f"{row['example']}: first finding {row['first_finding']}",
        f"  {row['fix']}: {speed} [{row['verdict']}, {row['status']}]; {guard}",
    ]
    if row.get("error"):
        lines.append(f"  error: {row['error']}")
    if row.get("contention"):
        lines.append(f"  contention: {row['contention']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per trial (default 20)")
    parser.add_argument("--trials", type=int, default=3, help="trials per arm (default 3)")
    parser.add_argument("--only", choices=[fix for _, fix, _ in PAIRS], help="one pair only")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (default 1)")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # recorded with the run, replayed
    print(f"OMP_NUM_THREADS={args.threads}, {args.trials} trials x {args.steps} steps per arm")
    rows = []
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-inference-") as tmp:
        os.environ["STEPSCOPE_HOME"] = tmp
        for script, fix, numerics in PAIRS:
            if args.only and fix != args.only:
                continue
            row = one(Path(tmp), script, fix, numerics, args.steps, args.trials)
            print(describe(row), flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
