"""What injecting the collectors costs a running job, read from the job's own clock.

Each round starts tests/jobs/train_clock.py plainly (an MLP, SGD, a 20 ms pause per step,
one line of its clock per ``optimizer.step()``), attaches to it with `stepscope attach
--duration D` once its loop runs, and lets it finish. From its clock: the median gap
between two steps, the largest gap while gdb held it and the collectors went in (the
pause the job felt), the median gap while they were in (the per-step cost), the largest
gap at detach, and the steps stepscope recorded against the job's own over the same
seconds. A second arm per round runs the same job unattached: the loop's whole time,
paired, with the ratio's median over the rounds.

    python bench/attach_inject.py                 # 3 rounds, attach for 4 s
    python bench/attach_inject.py --rounds 5 --duration 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepscope.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "jobs" / "train_clock.py"


def start(clock: Path, steps: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(steps), str(clock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    while not clock.exists() or len(clock.read_text().split()) < 20:  # in its loop
        time.sleep(0.05)
    return proc


def ends(clock: Path) -> list[float]:
    return [float(t) for t in clock.read_text().split()]


def gaps_ms(times: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]


def attached_round(folder: Path, steps: int, duration: float) -> dict[str, float]:
    home, clock = folder / "home", folder / "attached.clock"
    proc = start(clock, steps)
    begun = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "attach",
         str(proc.pid), "--duration", str(duration), "--json", "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    proc.wait(timeout=300)
    result = json.loads(out.stdout)
    with RunStore(home) as store:
        recorded = store.steps(result["run_id"])
        mode = (store.run(result["run_id"])["config"].get("inject") or {}).get("mode")
    times = ends(clock)
    first, last = float(recorded["start_s"].min()), float(recorded["end_s"].max())
    own = [t for t in times if first <= t <= min(t for t in times if t >= last)]
    before = [t for t in times if t < begun]
    during = [t for t in times if begun <= t <= first]  # gdb, imports, the safe point
    inside = [t for t in times if first <= t <= last]
    after = [t for t in times if last < t <= last + 2]
    return {
        "mode_injected": float(mode == "injected"),
        "median_gap_ms": statistics.median(gaps_ms(before)),
        "inject_pause_ms": max(gaps_ms(before[-1:] + during + inside[:1])),
        "median_gap_in_ms": statistics.median(gaps_ms(inside)),
        "detach_pause_ms": max(gaps_ms(inside[-1:] + after)),
        "recorded_steps": float(len(recorded)),
        "own_steps": float(len(own)),
        "loop_s": times[-1] - times[0],
    }


def plain_round(folder: Path, steps: int) -> float:
    clock = folder / "plain.clock"
    proc = start(clock, steps)
    proc.wait(timeout=300)
    times = ends(clock)
    return times[-1] - times[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--duration", type=float, default=4.0)
    args = p.parse_args()
    rows, ratios = [], []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            # alternate which arm goes first: a machine that slows down over the run
            # loads both arms alike
            if i % 2:
                plain = plain_round(folder, args.steps)
                row = attached_round(folder, args.steps, args.duration)
            else:
                row = attached_round(folder, args.steps, args.duration)
                plain = plain_round(folder, args.steps)
        row["loop_ratio"] = row["loop_s"] / plain
        rows.append(row)
        ratios.append(row["loop_ratio"])
        print(json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    keys = [k for k in rows[0] if k != "loop_s"]
    print("medians over", len(rows), "rounds:")
    for key in keys:
        values = sorted(r[key] for r in rows)
        print(
            f"  {key:18} {statistics.median(values):9.3f}  (min {values[0]:.3f}, max {values[-1]:.3f})"
        )


if __name__ == "__main__":
    main()
