"""What does `stepscope run`'s default cost a job: the automatic capture, and the verdict?

    python bench/capture_cost.py                       # dense_compute, 30 and 1000 steps, 3 rounds
    python bench/capture_cost.py --steps 30 --rounds 5 --json-out /tmp/capture_cost.json

Three ways of running one example under `stepscope run`, as a user does:

* ``bare``: ``--no-profile --quiet`` (steps and samples, no trace, no verdict);
* ``capture``: ``--quiet`` (the default capture of 3 steps, no verdict);
* ``default``: no options (the capture, then the diagnosis and the verdict at exit).

Each round runs the three in a rotated order (so drift and any advantage of running
first hit every arm alike) and times the whole process: what the user waits for, torch's
import and stepscope's set-up included. The figures are each arm's median wall time and
its ratio to ``bare``, the median of the per-round ratios with a paired bootstrap 95 %
interval over rounds (the round is what was interleaved). A 30-step job shows the fixed
cost (a trace export and one analysis of it); a 1000-step job how little of it is left
once the job is long.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
ARMS = {
    "bare": ["--no-profile", "--quiet"],
    "capture": ["--quiet"],
    "default": [],
}


def wall_time(home: Path, example: str, steps: int, options: list[str]) -> float:
    command = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", *options]
    command += ["--", sys.executable, str(REPO / "examples" / f"{example}.py")]
    command += ["--steps", str(steps)]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall


def ratio_ci(arm: np.ndarray, bare: np.ndarray) -> tuple[float, float]:
    if len(arm) < 2:
        return float("nan"), float("nan")
    boot = stats.bootstrap(
        (arm, bare),
        lambda a, b, axis=-1: np.median(a / b, axis=axis),
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=5_000,
        random_state=np.random.default_rng(0),
    )
    return float(boot.confidence_interval.low), float(boot.confidence_interval.high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="dense_compute", help="name in examples/")
    parser.add_argument(
        "--steps", type=int, nargs="+", default=[30, 1000], help="job lengths (default 30 1000)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three arms")
    parser.add_argument("--json-out", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=120)
    names = list(ARMS)
    results = []
    with tempfile.TemporaryDirectory(prefix="stepscope-capture-cost-") as tmp:
        for steps in args.steps:
            walls: dict[str, list[float]] = {name: [] for name in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    home = Path(tmp) / f"{steps}-{name}-{r}"
                    walls[name].append(wall_time(home, args.example, steps, ARMS[name]))
                    console.print(
                        f"{steps} steps, round {r + 1}: {name:8s} {walls[name][-1]:.1f} s"
                    )
            bare = np.array(walls["bare"])
            for name in names:
                arm = np.array(walls[name])
                results.append(
                    {
                        "steps": steps,
                        "arm": name,
                        "median_wall_s": statistics.median(walls[name]),
                        "ratio_to_bare": float(np.median(arm / bare)),
                        "ci95": ratio_ci(arm, bare) if name != "bare" else (1.0, 1.0),
                        "walls_s": walls[name],
                    }
                )
    table = Table(title=f"stepscope run's default on examples/{args.example}.py (whole process)")
    for col in ("steps", "arm", "median wall (s)", "vs bare", "95 % CI", "rounds"):
        table.add_column(col, justify="right")
    for row in results:
        lo, hi = row["ci95"]
        table.add_row(
            str(row["steps"]),
            row["arm"],
            f"{row['median_wall_s']:.1f}",
            f"{row['ratio_to_bare']:.3f}",
            f"{lo:.3f}-{hi:.3f}",
            str(len(row["walls_s"])),
        )
    console.print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
