"""Pin Holistic Trace Analysis 0.5.0's numbers on the real traces in tests/data.

The tests compare stepscope's idle-time, temporal and overlap analyses against the
JSON this writes (tests/reference/hta_reference.json), so they do not need HTA at
test time and cannot drift with it. Re-run it only to refresh the pin:

    python bench/reference_hta.py [--traces DIR] [--out FILE]

HTA wants one directory per job with one file per rank (it reads each file's rank
from its ``distributedInfo``), so every trace is linked into its own temp dir; the
two sampled ranks share one. HTA fails on traces without GPU kernels; such failures
are recorded with their error rather than skipped silently.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import platform
import shlex
import sys
import tempfile
import traceback
import warnings
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO / "tests" / "data"
DEFAULT_OUT = REPO / "tests" / "reference" / "hta_reference.json"

#: job name -> trace files of that job (one per rank)
JOBS: dict[str, list[str]] = {
    "resnet50_nw0": ["resnet50_v100_num_workers_0.pt.trace.json.gz"],
    "resnet50_nw4": ["resnet50_v100_num_workers_4.pt.trace.json.gz"],
    "a100_nccl": ["a100_nccl_3steps.json.gz"],
    "v100_ddp_ns": ["v100_ddp_rank0_ns_resolution.pt.trace.json.gz"],
    "sampled_2ranks": ["sampled_2ranks_rank-0.json.gz", "sampled_2ranks_rank-1.json.gz"],
    "cpu_only": ["cpu_only_rank34.pt.trace.json.gz"],
    "amd_mi250": ["amd_mi250_minitoy.json.gz"],
}


def _records(df) -> list[dict]:
    """Plain JSON records; HTA returns numpy scalars that json cannot write."""
    out = []
    for row in df.to_dict(orient="records"):
        clean = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
        # NaN (HTA's 0/0 on traces without communication) is not JSON; keep it as null
        out.append(
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in clean.items()}
        )
    return out


def _error(exc: BaseException) -> dict:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    return {
        "error": f"{type(exc).__name__}: {exc}"[:500],
        "where": f"{Path(last.filename).name}:{last.lineno}",
    }


def run_job(files: list[Path]) -> dict:
    """Run the three HTA analyses on one job; each one may fail on its own."""
    from hta.trace_analysis import TraceAnalysis

    result: dict = {"files": [f.name for f in files]}
    with tempfile.TemporaryDirectory(prefix="hta_ref_") as tmp:
        for f in files:
            os.symlink(f, Path(tmp) / f.name)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                analysis = TraceAnalysis(trace_dir=tmp)
        except Exception as exc:  # HTA's own failure is the data we record
            result["load"] = _error(exc)
            return result
        ranks = sorted(analysis.t.traces)
        result["ranks"] = ranks
        calls = {
            "temporal_breakdown": lambda: analysis.get_temporal_breakdown(visualize=False),
            "idle_time_breakdown": lambda: analysis.get_idle_time_breakdown(
                ranks=ranks, visualize=False
            )[0],
            "comm_comp_overlap": lambda: analysis.get_comm_comp_overlap(visualize=False),
        }
        for name, call in calls.items():
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    result[name] = _records(call())
            except Exception as exc:
                result[name] = _error(exc)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    logging.getLogger("hta").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    if not args.traces.is_dir():
        print(f"traces folder not found: {args.traces}", file=sys.stderr)
        return 2

    jobs = {}
    for job, names in JOBS.items():
        files = [(args.traces / n).resolve() for n in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            jobs[job] = {"files": names, "load": {"error": f"missing {missing}"}}
            continue
        print(f"HTA on {job} ...", file=sys.stderr)
        jobs[job] = run_job(files)

    pinned = {
        "about": "HTA 0.5.0 reference numbers; written by bench/reference_hta.py, read by tests",
        "command": "python bench/reference_hta.py " + shlex.join(argv or sys.argv[1:]),
        "versions": {p: version(p) for p in ("HolisticTraceAnalysis", "pandas", "numpy", "torch")}
        | {"python": platform.python_version()},
        "units": "HTA works in the trace's microseconds (times rounded: ts up, end down)",
        "consecutive_kernel_delay_us": 30,
        "jobs": jobs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(pinned, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
