"""The whole loop on the corpus of real-style jobs: run, analyze, optimize, one row each.

    python bench/realworld.py                         # every job, 2 trials x 16 steps
    python bench/realworld.py --jobs imagenet_style,mlp_adamw --trials 3 --steps 24
    python bench/realworld.py --json bench/results/realworld.json

For each job of ``examples/corpus`` (see its README): ``stepscope run`` records it (the
job's own output kept in the run folder), the step count is compared with the
iterations the script itself reports on its ``CORPUS`` line, ``analyze`` gives the
verdict, and ``optimize`` re-runs it with the recommended automatic fixes (fixes that
change numerics only with ``--allow-numerics``), interleaved with baseline trials. One
row per job: steps recorded vs the script's count, the verdict, the best fix with its
measured speed-up and 95 % interval, fixes that were not applied and why, and whether
other work competed for the cores during the trials.

Speed-ups are measured here, never asserted in tests: on a shared 2-core machine a
verdict can move with the load, which the contention column reports.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.experiment.experiment import ExperimentOptions, run_experiment
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "examples" / "corpus"
OUTPUT = "output.log"


@dataclass(frozen=True)
class Job:
    """One corpus job: its command and how it is recorded and optimized."""

    name: str
    args: tuple[str, ...] = ()
    torchrun: int = 0  # ranks, for a torchrun job
    max_steps: int | None = None  # the recorded run's limit (None: the script's own end)
    optimize: bool = True
    notes: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        script = str(CORPUS / f"{self.name}.py")
        if self.torchrun:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            return [*launcher, "--nproc_per_node", str(self.torchrun), script, *self.args]
        return [sys.executable, script, *self.args]


JOBS = (
    Job("imagenet_style", ("-j", "0", "--epochs", "1", "--iters-per-epoch", "40")),
    Job("hf_trainer", ("--max-steps", "30")),
    Job("lightning_job", ("--max-steps", "60")),
    Job("nanogpt_style", ("--max_iters", "30")),
    Job("dcgan_style"),
    Job("rnn_manual_sgd"),
    Job("mlp_adamw", ("--iters", "40")),
    Job("ddp_few_steps", ("--steps", "1"), torchrun=2, optimize=False),
)


def corpus_line(text: str) -> dict[str, Any] | None:
    """The script's own account: ``CORPUS {"iterations": N, ...}`` (rank 0's)."""
    for line in text.splitlines():
        if line.startswith("CORPUS "):
            return json.loads(line[len("CORPUS ") :])
    return None


def one_job(home: Path, job: Job, steps: int, trials: int, allow_numerics: bool) -> dict[str, Any]:
    """Record, diagnose and optimize one job; everything the row shows."""
    row: dict[str, Any] = {"job": job.name, "command": job.command()}
    started = time.monotonic()
    run_id, code = launch_run(
        job.command(), home=home, max_steps=job.max_steps, quiet=True, output_path=OUTPUT
    )
    row.update(run_id=run_id, exit_code=code, record_s=round(time.monotonic() - started, 1))
    with RunStore(home) as store:
        run = store.run(run_id)
        output = (store.run_dir(run_id) / OUTPUT).read_text(errors="replace")
        own = corpus_line(output) or {}
        recorded = store.steps(run_id)
        rank0 = recorded[recorded["rank"] == 0] if len(recorded) else recorded
        row["steps_recorded"] = int(len(rank0))
        row["script_iterations"] = own.get("iterations")
        row["status"] = run["status"]
        diagnosis = diagnose_run(store, run_id)
        top = diagnosis.findings[0] if diagnosis.findings else None
        row["verdict"] = (
            f"{top.klass}/{top.subtype} {100 * top.share:.0f} %" if top is not None else "none"
        )
        row["level"] = diagnosis.level
        if not job.optimize:
            row["optimize"] = "not tried: " + (job.notes[0] if job.notes else "too few steps")
            return row
        started = time.monotonic()
        try:
            options = ExperimentOptions(steps=steps, trials=trials, allow_numerics=allow_numerics)
            result = run_experiment(store, run_id, options)
        except ValueError as exc:
            row["optimize"] = f"nothing to try: {exc}"
            return row
        row["optimize_s"] = round(time.monotonic() - started, 1)
    row["experiment"] = result["experiment_id"]
    best = result["best"]
    row["best"] = best
    row["fixes"] = [
        {k: f.get(k) for k in ("id", "measured", "ci", "verdict", "status", "kept", "note")}
        | {"not_applied_why": f.get("not_applied_why"), "predicted": f.get("predicted")}
        for f in result["fixes"]
    ]
    row["not_applied"] = [
        f"{f['id']}: {f['not_applied_why']}"
        for f in result["fixes"]
        if f["status"] == "not applied"
    ]
    row["contention"] = result.get("contention", {}).get("warning")
    return row


def _speedup(best: dict[str, Any] | None) -> str:
    if not best or not best.get("fixes"):
        return "-"
    lo, hi = best["ci"]
    return f"{best['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="stepscope on the corpus: run -> analyze -> optimize")
    for name in ("job", "steps / script", "verdict", "best fix", "speed-up (95 % CI)", "notes"):
        out.add_column(name)
    for r in rows:
        notes = list(r.get("not_applied") or [])
        if r.get("optimize"):
            notes.append(r["optimize"])
        for f in r.get("fixes") or []:
            if f["status"] == "completed" and not f["kept"]:
                notes.append(f"{f['id']} {f['measured']:.2f}x ({f['verdict']})")
            if f.get("note"):
                notes.append(f"{f['id']}: {f['note']}")
        if r.get("contention"):
            notes.append(r["contention"])
        best = r.get("best") or {}
        out.add_row(
            escape(r["job"]),
            f"{r['steps_recorded']} / {r['script_iterations']}",
            escape(r["verdict"]),
            escape(", ".join(best.get("fixes") or []) or "-"),
            _speedup(best),
            escape("; ".join(notes)),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", help="comma-separated job names (default: all)")
    parser.add_argument("--steps", type=int, default=16, help="steps per trial")
    parser.add_argument("--trials", type=int, default=2, help="trials per arm")
    parser.add_argument("--allow-numerics", action="store_true")
    parser.add_argument("--home", type=Path, help="run store (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "realworld.json")
    args = parser.parse_args(argv)
    wanted = set(args.jobs.split(",")) if args.jobs else None
    jobs = [j for j in JOBS if wanted is None or j.name in wanted]
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope-realworld-"))
    os.environ["STEPSCOPE_HOME"] = str(home)
    console = Console(stderr=True)
    rows = []
    for n, job in enumerate(jobs, 1):
        console.print(f"[{n}/{len(jobs)}] {escape(job.name)} ...")
        rows.append(one_job(home, job, args.steps, args.trials, args.allow_numerics))
        r = rows[-1]
        console.print(
            f"      {r['steps_recorded']} steps / {r['script_iterations']} iterations, "
            f"{escape(r['verdict'])}, best {escape(_speedup(r.get('best')))}"
        )
    Console(width=200).print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "load_avg": os.getloadavg(),
        "cores": os.cpu_count(),
        "steps": args.steps,
        "trials": args.trials,
        "home": str(home),
        "rows": rows,
    }
    args.json.write_text(json.dumps(report, indent=1, default=str))
    console.print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
