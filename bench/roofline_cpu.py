"""Where a GEMM-heavy and an elementwise-heavy CPU job sit on this host's roofline.

    python bench/roofline_cpu.py [--seconds 3] [--steps 5] [--json OUT]

Calibrates this host (``stepscope.collectors.facts.calibrate.calibrate``: best-of matmul
FLOP/s and STREAM triad bandwidth, at torch's current thread count, what the jobs get),
then captures two jobs with ``torch.profiler`` (``record_shapes=True``), one after the
other in this process, and reads each against the calibration with
``stepscope.analyzers.hardware.roofline``:

* GEMM-heavy: an MLP (two 1024x1024 Linear layers, batch 256) trained with SGD in a
  plain loop. Issue 14 expects its matmuls between 20 % and 100 % of the calibrated
  compute roof (the calibration is the best repeat of a cache-sized square matmul; the
  job's matmuls are smaller, one of them is transposed, and each step also runs the
  elementwise and optimizer ops).
* elementwise-heavy: arithmetic and activations over 4 M-element float32 tensors (16 MB,
  twice the 8 MB L3 of the test VM), so they stream from memory. Expected: under the
  memory roof (< 100 % of the triad bandwidth) and far under the compute roof.

Numbers are ratios to a calibration measured seconds before, on the same cores, so
drift on a shared machine moves both; they are not a timing test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from stepscope.analyzers.hardware.roofline import Roofline, roofline
from stepscope.analyzers.trace.load import load_trace
from stepscope.collectors.facts.calibrate import calibrate


def gemm_job(steps: int, step: Callable[[], None]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 1024), torch.randn(256, 1024)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        step()


def elementwise_job(steps: int, step: Callable[[], None]) -> None:
    a, b = torch.randn(4_000_000), torch.randn(4_000_000)
    for _ in range(steps):
        c = torch.sigmoid(a) * b + a
        a = torch.relu(c - b)
        b.mul_(0.5).add_(a)
        step()


def capture(folder: Path, name: str, job: Callable, steps: int) -> Path:
    path = folder / f"{name}.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        job(steps + 1, prof.step)
    return path


def describe(name: str, r: Roofline, cls: str) -> dict:
    row = r.classes.set_index("op_class").loc[cls]
    print(f"\n{name}: MFU {r.mfu:.1%} of {r.compute_tflops * 1e3:.1f} GFLOP/s; ridge {r.ridge:.2f}")
    cols = ["op_class", "count", "time_ns", "share", "tflops", "gbs", "intensity"]
    cols += ["pct_compute_roof", "pct_memory_roof", "bound"]
    print(r.classes[cols].to_string(index=False))
    print(
        f"  {cls}: {row['tflops'] * 1e3:.1f} GFLOP/s, {row['gbs']:.1f} GB/s, "
        f"{row['intensity']:.3g} FLOP/byte ({row['bound']}-bound): "
        f"{row['pct_compute_roof']:.1%} of the compute roof, "
        f"{row['pct_memory_roof']:.1%} of the memory roof"
    )
    return {
        "mfu": r.mfu,
        "class": cls,
        **{k: row[k] for k in ("tflops", "gbs", "intensity", "pct_compute_roof")},
        "pct_memory_roof": row["pct_memory_roof"],
        "bound": row["bound"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="calibration budget")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per job")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    cal = calibrate(seconds=args.seconds)
    print(f"calibration: {cal.matmul_gflops:.1f} GFLOP/s matmul, {cal.triad_gbs:.1f} GB/s triad")
    print(f"  ({cal.conditions()})")
    with tempfile.TemporaryDirectory() as tmp:
        gemm = roofline(
            load_trace(capture(Path(tmp), "gemm", gemm_job, args.steps)), calibration=cal
        )
        ew = roofline(
            load_trace(capture(Path(tmp), "ew", elementwise_job, args.steps)), calibration=cal
        )
    out = {
        "calibration": cal.to_dict(),
        "gemm": describe("GEMM-heavy MLP", gemm, "matmul"),
        "elementwise": describe("elementwise-heavy loop", ew, "elementwise"),
    }
    mm, el = out["gemm"], out["elementwise"]
    print(
        f"\nmatmuls at {mm['pct_compute_roof']:.0%} of the compute roof (issue 14: 20-100 %); "
        f"elementwise at {el['pct_memory_roof']:.0%} of the memory roof (expected < 100 %)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
