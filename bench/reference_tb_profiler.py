"""Regenerate tests/reference/tb_profiler_breakdown.json with torch-tb-profiler.

The breakdown and GPU-metrics tests compare stepscope with the numbers torch-tb-profiler
0.4.3 shows on its overview page for the same traces. tb-profiler is slow (seconds per
trace) and only a dev dependency, so its numbers are pinned in a file and this script,
which takes them exactly the way its loader does (``RunProfileData.parse`` then
``RunGenerator.generate_run_profile``), is how they were obtained:

    python bench/reference_tb_profiler.py            # writes the json
    python bench/reference_tb_profiler.py --check    # only prints them
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from stepscope.analyzers.trace.breakdown import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data"
OUT = ROOT / "tests" / "reference" / "tb_profiler_breakdown.json"
# The resnet50 pair is what tb-profiler can read fully (old category names); on the
# A100 trace only its kernel-name Tensor Core ratio is meaningful (it ignores the
# 'cuda_runtime' category there), so only that number is pinned for it.
FULL = [
    "resnet50_v100_num_workers_0.pt.trace.json.gz",
    "resnet50_v100_num_workers_4.pt.trace.json.gz",
]
TC_ONLY = ["a100_nccl_3steps.json.gz"]
ROLES = CATEGORIES  # tb-profiler's ProfileRole order, which the breakdown keeps


def run_tb(path: Path):
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    with tempfile.TemporaryDirectory() as cache:
        data = RunProfileData.parse("worker0", None, str(path), cache)
        run = RunGenerator("worker0", None, data).generate_run_profile()
    return data, run


def full_reference(path: Path) -> dict:
    data, _run = run_tb(path)
    avg = data.avg_costs.costs
    total = avg[len(ROLES)]
    gpu = data.gpu_metrics_parser
    devices = {}
    for gid in sorted(gpu.gpu_ids):
        devices[str(gid)] = {
            "gpu_utilization_percent": 100.0 * gpu.gpu_utilization[gid],
            "sm_efficiency_percent": None
            if gpu.avg_approximated_sm_efficiency_per_device[gid] is None
            else 100.0 * gpu.avg_approximated_sm_efficiency_per_device[gid],
            "achieved_occupancy_percent": gpu.avg_occupancy_per_device[gid],
            "tensor_core_percent": None
            if data.tc_ratio[gid] is None
            else 100.0 * data.tc_ratio[gid],
        }
    return {
        "steps": data.steps_names,
        "step_duration_us": [c.costs[len(ROLES)] for c in data.steps_costs],
        "avg_step_us": total,
        "avg_us": {r: avg[i] for i, r in enumerate(ROLES)},
        "percent": {r: 100.0 * avg[i] / total for i, r in enumerate(ROLES)},
        "per_step_us": [{r: c.costs[i] for i, r in enumerate(ROLES)} for c in data.steps_costs],
        "gpu": devices,
        "kernel_tensor_core_percent": 100.0 * (data.tc_used_ratio or 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print, do not write")
    args = ap.parse_args(argv)
    import torch_tb_profiler

    ref: dict = {
        "tool": "torch-tb-profiler",
        "version": getattr(torch_tb_profiler, "__version__", "unknown"),
        "how": "python bench/reference_tb_profiler.py (RunProfileData.parse + "
        "RunGenerator.generate_run_profile); times in microseconds as tb-profiler keeps them",
        "traces": {},
    }
    for name in FULL:
        ref["traces"][name] = full_reference(TRACES / name)
    for name in TC_ONLY:
        data, _ = run_tb(TRACES / name)
        ref["traces"][name] = {"kernel_tensor_core_percent": 100.0 * (data.tc_used_ratio or 0.0)}
    text = json.dumps(ref, indent=1, sort_keys=False)
    if args.check:
        print(text)
    else:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text + "\n")
        print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
