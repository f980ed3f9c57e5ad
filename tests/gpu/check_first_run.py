"""Checks the first run and the adaptive optimize on a CUDA machine, as a user runs them.

    PYTHONPATH=/path/to/repo python tests/gpu/check_first_run.py [--home DIR] [--cpu-dry-run]

`stepscope run --max-steps 40 -- python tests/gpu/cuda_job.py --fp32` with no capture
option: the default capture must be taken once step times settle (a Kineto trace with
CUDA kernels, a CUDA memory snapshot, profiled steps left out of the timing), and the
verdict printed at exit must rest on it. Then `stepscope optimize last` with bf16
autocast, the fused optimizer and torch.compile, adaptive (the default): every arm runs
or says why not, the bf16 and compile arms take effect on CUDA, and the report says how
many rounds ran and what stopped early. Speed-ups are printed, not asserted. PASS/FAIL
lines; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import check_generation as gen

from stepscope.store import RunStore

JOB = str(gen.REPO / "tests" / "gpu" / "cuda_job.py")
FIXES = "bf16_autocast,fused_optimizer,torch_compile"


def check_first_run(home: Path, cpu: bool) -> int:
    job = ["python", JOB, "--fp32", *(["--cpu"] if cpu else [])]
    out = gen.cli(home, "run", "--max-steps", "40", "--", *job)
    gen.check("stepscope run exits 0", out.returncode == 0, out.stderr[-300:])
    verdict = [ln for ln in out.stderr.splitlines() if "verdict:" in ln]
    print("      " + "\n      ".join(verdict + out.stderr.splitlines()[-8:]))
    run_id = gen.last_run(home)
    with RunStore(home) as store:
        arts = store.artifacts(run_id)
        steps = store.steps(run_id)
    kinds = sorted(arts["kind"]) if len(arts) else []
    gen.check("the default capture left a trace", "trace" in kinds, str(kinds))
    if not cpu:
        gen.check("... and a CUDA memory snapshot", "memory_snapshot" in kinds, str(kinds))
        gen.check("steps carry CUDA-event times", bool(steps["device_s"].notna().any()))
    gen.check("profiled steps recorded", int(steps["profiled"].sum()) >= 3)
    shown = gen.cli(home, "show", str(run_id), "--json")
    diagnosis = json.loads(shown.stdout).get("diagnosis") or {}
    gen.check(
        "the verdict at exit rests on the trace",
        bool(verdict) and diagnosis.get("level") == "trace",
        str(diagnosis.get("level")),
    )
    for line in diagnosis.get("verdict") or []:
        print("      " + line)
    return run_id


def check_optimize(home: Path, run_id: int, fixes: str) -> None:
    out = gen.cli(
        home,
        *("optimize", str(run_id), "--fixes", fixes, "--allow-numerics"),
        *("--steps", "30", "--trials", "3", "--json"),
        timeout=480,
    )
    if out.returncode != 0:
        gen.check("optimize (adaptive) completes", False)
        return
    result = json.loads(out.stdout)
    design = result.get("design") or {}
    print(f"      design: {design.get('mode')}, rounds {design.get('rounds')}/"
          f"{design.get('max_rounds')}, ended: {design.get('ended')}, "
          f"stopped: {design.get('stopped')}, repeated: {(result.get('repeated') or {}).get('count')}")  # fmt: skip
    for cand in result["candidates"]:
        print(f"      arm {cand['name']}: {cand['status']} speed-up {cand.get('speedup')} "
              f"ci {cand.get('ci')} trials {len(cand.get('runs') or [])} "
              f"{cand.get('stopped') or ''} {cand.get('error') or ''}")  # fmt: skip
        if cand["status"] not in ("completed", "stopped"):
            gen.print_trial_log(home, [*(cand.get("runs") or []), *[cand.get("failed_run")]])
    names = {c["name"]: c for c in result["candidates"]}
    for fix in ("bf16_autocast", "torch_compile") if fixes == FIXES else ():
        cand = names.get(fix)
        gen.check(
            f"{fix} arm took effect and was measured",
            cand is not None and cand.get("speedup") is not None,
            str(cand and cand["status"]),
        )
    gen.check("the report has its design", design.get("mode") == "adaptive")
    print(f"      kept: {(result.get('best') or {}).get('fixes')}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--home", type=Path, default=None)
    p.add_argument("--cpu-dry-run", action="store_true", help="the script's own test, on a CPU")
    p.add_argument("--no-optimize", action="store_true")
    p.add_argument("--fixes", default=FIXES, help="to optimize with")
    args = p.parse_args()
    import torch

    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("FAIL  no CUDA device visible to torch")
        return 1
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope_gpu_first_"))
    run_id = check_first_run(home, args.cpu_dry_run)
    if not args.no_optimize:
        check_optimize(home, run_id, args.fixes)
    print(f"{'ALL PASS' if gen.failures == 0 else f'{gen.failures} FAILED'}  (store: {home})")
    return 1 if gen.failures else 0


if __name__ == "__main__":
    sys.exit(main())
