"""How much sooner does the adaptive `stepscope optimize` reach the same verdict as --full?

    python bench/time_to_verdict.py                            # the four jobs, 3 trials x 30 steps
    python bench/time_to_verdict.py --jobs mlp_adamw nanogpt_style
    python bench/time_to_verdict.py --quick --jobs input_bound # a check that it works (~2 min)
    python bench/time_to_verdict.py --json-out bench/results/time_to_verdict.json

For each job: ``stepscope run`` records it once (its default capture and verdict, so the
recommended fixes are known), then the store is copied twice, and ``stepscope optimize
RUN --json`` runs in each copy with the same trial settings: once with ``--full`` (every
candidate gets every trial) and once adaptive (the default: decided arms stop, the
experiment ends when it knows). Copies of one recording, so both try the same fixes on the
same baseline; fresh stores, so neither sees the other's trials. Which of the two runs
first alternates from job to job, so the machine's drift does not always favour one.

One row per job: the fixes kept by each, the gain of each (the best candidate's speed-up;
the adaptive one's gain, speed-up - 1, as a % of full's), the wall time of each optimize
process and their ratio, the adaptive rounds run and the arms it stopped. A second table reads leave-one-out in each design:
the fastest arm it started from, the set it kept and its gain as a % of that arm's, each
kept fix's share, the fixes dropped, and the wall time of its trials against the first
round's (the trial runs' own start and end, from the store). A verdict moves
with the load on a small shared machine: read the kept fixes first, the figures second.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
MODES = ("full", "adaptive")


@dataclass(frozen=True)
class Job:
    name: str
    script: Path
    args: tuple[str, ...] = ()
    max_steps: int | None = None  # the recorded run's limit (None: the script's own end)

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), *self.args]


JOBS = {
    # the example the demo records (`stepscope demo`): DataLoader workers win big
    "input_bound": Job("input_bound", EXAMPLES / "input_bound.py", ("--steps", "40")),
    "imagenet_style": Job(
        "imagenet_style",
        EXAMPLES / "corpus" / "imagenet_style.py",
        ("-j", "0", "--epochs", "1", "--iters-per-epoch", "40"),
    ),
    "mlp_adamw": Job("mlp_adamw", EXAMPLES / "corpus" / "mlp_adamw.py", ("--iters", "40")),
    "nanogpt_style": Job(
        "nanogpt_style", EXAMPLES / "corpus" / "nanogpt_style.py", ("--max_iters", "30")
    ),
}
QUICK_JOBS = ("input_bound", "mlp_adamw")


def stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args]
    # each home compiles from cold: inductor's cache in /tmp would otherwise let whichever
    # design runs second reuse the first one's compiled kernels (torch_compile arms)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor-cache")}
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def record(home: Path, job: Job) -> None:
    limit = ("--max-steps", str(job.max_steps)) if job.max_steps else ()
    stepscope(home, "run", "--quiet", "--name", job.name, *limit, "--", *job.command())


def optimize(home: Path, job: Job, mode: str, steps: int, trials: int) -> dict[str, Any]:
    """One `stepscope optimize` in ``home``; its result and the process's wall time."""
    extra = ("--full",) if mode == "full" else ()
    started = time.perf_counter()
    proc = stepscope(
        home, "optimize", job.name, "--steps", str(steps), "--trials", str(trials), "--json", *extra
    )
    wall = time.perf_counter() - started
    result = json.loads(proc.stdout)
    best = result["best"]
    design = result.get("design") or {}
    loo = result.get("leave_one_out") or {}
    fastest = max(
        (c for c in result["candidates"] if c["status"] == "completed" and c.get("speedup")),
        key=lambda c: c["speedup"],
        default=None,
    )
    return {
        "mode": mode,
        "wall_s": round(wall, 1),
        "kept": list(best["fixes"]),
        "speedup": best["speedup"],
        "ci": best["ci"],
        "rounds": design.get("rounds"),
        "max_rounds": design.get("max_rounds"),
        "ended": design.get("ended"),
        "stopped": design.get("stopped") or {},
        "trial_runs": sum(len(c["runs"]) for c in result["candidates"])
        + len(result["baseline"]["runs"])
        + len(result["baseline"]["confirm_runs"]),
        "repeated": (result.get("repeated") or {}).get("count"),
        "contention": (result.get("contention") or {}).get("warning"),
        "experiment_id": result["experiment_id"],
        # leave-one-out: the fastest arm it started from, what it kept and each share
        "fastest": None if fastest is None else [fastest["name"], fastest["speedup"]],
        "kept_pct_of_fastest": gain_pct(fastest and fastest["speedup"], best["speedup"]),
        "loo_steps": len(loo.get("steps") or []),
        "loo_dropped": sorted(loo.get("dropped") or {}),
        "loo_shares": {
            fix: (r.get("share") or {}).get("ratio") for fix, r in (loo.get("shares") or {}).items()
        },
        "phase_s": phase_seconds(home, result["experiment_id"]),
    }


def phase_seconds(home: Path, experiment_id: int) -> dict[str, float]:
    """Wall seconds of the experiment's trial runs: its first round, and leave-one-out's."""
    out = {"first_round": 0.0, "leave_one_out": 0.0}
    with RunStore(home) as store:
        for run_id in store.runs()["id"]:
            run = store.run(int(run_id))
            cfg = run.get("config") or {}
            if cfg.get("experiment") != experiment_id or run.get("ended_at") is None:
                continue
            took = float(run["ended_at"]) - float(run["started_at"])
            if cfg.get("phase") == "leave_one_out":
                out["leave_one_out"] += took
            elif cfg.get("phase") == "trials" and cfg.get("trial") == 0:
                out["first_round"] += took
    return {k: round(v, 1) for k, v in out.items()}


def one_job(root: Path, job: Job, index: int, steps: int, trials: int, say: Any) -> dict[str, Any]:
    recorded = root / job.name / "recorded"
    started = time.perf_counter()
    record(recorded, job)
    say(f"{job.name}: recorded in {time.perf_counter() - started:.0f} s")
    row: dict[str, Any] = {"job": job.name, "command": job.command()}
    order = MODES if index % 2 == 0 else MODES[::-1]
    for mode in order:
        home = root / job.name / mode
        shutil.copytree(recorded, home)
        row[mode] = optimize(home, job, mode, steps, trials)
        out = row[mode]
        say(f"{job.name}: {mode} {out['wall_s']:.0f} s, kept {', '.join(out['kept']) or 'none'}")
    full, adaptive = row["full"], row["adaptive"]
    row["wall_ratio"] = round(adaptive["wall_s"] / full["wall_s"], 3) if full["wall_s"] else None
    row["same_fixes"] = sorted(full["kept"]) == sorted(adaptive["kept"])
    row["gain_pct_of_full"] = gain_pct(full["speedup"], adaptive["speedup"])
    return row


def gain_pct(full: float | None, adaptive: float | None) -> float | None:
    """The adaptive gain (speed-up - 1) as a % of full's; None where full kept nothing."""
    if full is None or full <= 1.0:
        return None
    return round(100.0 * ((adaptive or 1.0) - 1.0) / (full - 1.0), 1)


def _gain(out: dict[str, Any]) -> str:
    if out["speedup"] is None:
        return "-"
    lo, hi = out["ci"]
    return f"{out['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"


def table(rows: list[dict[str, Any]], steps: int, trials: int) -> Table:
    out = Table(title=f"time to verdict: --full vs adaptive ({trials} trials x {steps} steps)")
    columns = (
        "job",
        "kept (full)",
        "kept (adaptive)",
        "gain (full)",
        "gain (adaptive)",
        "adaptive % of full",
        "wall full",
        "wall adaptive",
        "ratio",
        "adaptive rounds, stopped",
    )
    for name in columns:
        out.add_column(name)
    for r in rows:
        full, adaptive = r["full"], r["adaptive"]
        pct = r["gain_pct_of_full"]
        out.add_row(
            r["job"],
            escape(", ".join(full["kept"]) or "none"),
            escape(", ".join(adaptive["kept"]) or "none"),
            _gain(full),
            _gain(adaptive),
            "-" if pct is None else f"{pct:.0f} %",
            f"{full['wall_s']:.0f} s",
            f"{adaptive['wall_s']:.0f} s",
            "-" if r["wall_ratio"] is None else f"{r['wall_ratio']:.2f}",
            f"{adaptive['rounds']}/{adaptive['max_rounds']}, "
            f"{len(adaptive['stopped'])} stopped; {adaptive['ended'] or 'all rounds ran'}",
        )
    return out


def loo_table(rows: list[dict[str, Any]]) -> Table:
    """Leave-one-out in each design: from which arm, what it kept, each kept fix's share,
    and its trials' time against the first round's."""
    out = Table(title="leave-one-out from the fastest arm")
    for name in ("job", "design", "fastest arm", "kept", "% of its gain", "shares", "dropped",
                 "loo s / first round s"):  # fmt: skip
        out.add_column(name)
    for r in rows:
        for mode in MODES:
            o = r[mode]
            fastest = "-" if o["fastest"] is None else f"{o['fastest'][0]} {o['fastest'][1]:.2f}x"
            pct = o["kept_pct_of_fastest"]
            shares = ", ".join(f"{k} {v:.2f}x" for k, v in o["loo_shares"].items() if v)
            secs = o["phase_s"]
            ratio = (
                f"{secs['leave_one_out']:.0f} / {secs['first_round']:.0f} = "
                f"{secs['leave_one_out'] / secs['first_round']:.2f}"
                if secs["first_round"]
                else "-"
            )
            out.add_row(
                r["job"],
                mode,
                escape(fastest),
                escape(", ".join(o["kept"]) or "none"),
                "-" if pct is None else f"{pct:.0f} %",
                escape(shares or "-"),
                escape(", ".join(o["loo_dropped"]) or "-"),
                ratio if o["loo_steps"] else "not run",
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), help="default: all four")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a check that it works: 12 steps per trial, jobs {', '.join(QUICK_JOBS)} "
        "unless --jobs",
    )
    parser.add_argument("--steps", type=int, help="steps per trial (default 30; --quick 12)")
    parser.add_argument("--trials", type=int, default=3, help="most trials per arm (default 3)")
    parser.add_argument("--json-out", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args()
    names = args.jobs or (list(QUICK_JOBS) if args.quick else list(JOBS))
    steps = args.steps or (12 if args.quick else 30)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    started = dt.datetime.now().isoformat(timespec="seconds")
    rows = []
    with tempfile.TemporaryDirectory(prefix="stepscope-time-to-verdict-") as tmp:
        for i, name in enumerate(names):
            rows.append(one_job(Path(tmp), JOBS[name], i, steps, args.trials, console.print))
    console.print(table(rows, steps, args.trials))
    console.print(loo_table(rows))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        conditions = {
            "started": started,
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
            "steps": steps,
            "trials": args.trials,
        }
        Path(args.json_out).write_text(
            json.dumps({"conditions": conditions, "rows": rows}, indent=1)
        )
        console.print(f"written: {args.json_out}")


if __name__ == "__main__":
    main()
