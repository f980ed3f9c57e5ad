"""An experiment in a background process, followed through the store (the dashboard).

A dashboard request must not wait minutes for trials, nor end them when the page is
left: ``start_experiment`` creates the experiment row and starts
``python -m stepscope.optim_runner.background`` on it in its own session. That process
runs ``run_experiment``, which writes its progress and result to the row; the
dashboard reads them from there (``RunStore.experiment``). ``cancel_experiment`` asks
it to stop with SIGTERM, which ends its running trial as well. A batch-size sweep
(``start_sweep``) is an experiment of another kind, started and followed the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stepscope.optim_runner import plan as planning
from stepscope.optim_runner.adaptive import check_budget
from stepscope.optim_runner.experiment import (
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    ExperimentError,
    check_size,
    process_started_at,
    run_experiment,
)
from stepscope.optim_runner.output_guard import check_limits
from stepscope.optim_runner.sweep import SWEEP_KIND, check_sweepable, run_sweep
from stepscope.optim_runner.sweep_figures import FIX_ID
from stepscope.store import RunStore
from stepscope.store.liveness import signalable_pid

MODULE = "stepscope.optim_runner.background"


def start_experiment(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    *,
    fixes: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    allow_numerics: bool = False,
    keep_explicit: bool = False,
    output_tolerance: float | None = None,
    min_agreement: float | None = None,
    draft_model: str | None = None,
    budget_min: float | None = None,
    full: bool = False,
) -> int:
    """Start an experiment in a background process; returns its id at once.

    The fixes are chosen here, in the caller, so that a request with nothing to try
    (or an unknown fix id) fails as a ValueError rather than in a process nobody
    watches. Progress and result are read with ``RunStore.experiment(id)``; the
    process's own output goes to ``<home>/experiments/<id>.log``.
    """
    check_size(steps, trials)
    check_limits(output_tolerance, min_agreement)
    check_budget(budget_min, full)
    with RunStore(home) as store:
        planned = planning.choose_fixes(store, baseline_run_id, fixes, allow_numerics, draft_model)
        if not planned:
            raise ValueError(f"no automatic fix is recommended for run {baseline_run_id}")
        config = {
            "fixes": [f.id for f in planned],
            "steps": steps,
            "trials": trials,
            "timeout_s": timeout_s,
            "allow_numerics": allow_numerics,
            "keep_explicit": keep_explicit,
            "output_tolerance": output_tolerance,  # the output guard's (inference jobs)
            "min_agreement": min_agreement,
            "draft_model": draft_model,
            "budget_min": budget_min,  # None: the default (adaptive.py)
            "full": full,
        }
        return _spawn(store, baseline_run_id, config)


def start_sweep(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    *,
    factors: list[int] | tuple[int, ...] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
) -> int:
    """Start a batch-size sweep in a background process; returns its experiment id at
    once (a run that cannot be swept fails here, as a ValueError in one line)."""
    check_size(steps, trials)
    with RunStore(home) as store:
        check_sweepable(store, baseline_run_id)
        config = {
            "kind": SWEEP_KIND,
            "sweep": "batch",
            "factors": sorted({int(f) for f in factors} | {1}) if factors else None,
            "fixes": [FIX_ID],
            "steps": steps,
            "trials": trials,
            "timeout_s": timeout_s,
        }
        return _spawn(store, baseline_run_id, config)


def _spawn(store: RunStore, baseline_run_id: int, config: dict[str, Any]) -> int:
    """Create the experiment's row and start ``main`` on it in a session of its own (it
    outlives the dashboard's request, not its signals); its output goes to
    ``<home>/experiments/<id>.log``."""
    experiment_id = store.create_experiment(baseline_run_id, config)
    store.update_experiment(experiment_id, progress={"event": "starting", "done": 0})
    log_dir = store.home / "experiments"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", MODULE, "--home", str(store.home)]
    cmd += ["--experiment", str(experiment_id)]
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with open(log_dir / f"{experiment_id}.log", "ab") as log:
        child = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    store.update_experiment(
        experiment_id, pid=child.pid, pid_started_at=process_started_at(child.pid)
    )
    return experiment_id


def cancel_experiment(store: Any, experiment_id: int) -> bool:
    """Ask a running experiment to stop (SIGTERM); its running trial is ended as well."""
    row = store.experiment(experiment_id)
    pid = signalable_pid(row) if row["status"] == "running" else None
    if pid is None:  # ended, or not a process of this host (a shared store)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m stepscope.optim_runner.background``: run one experiment, result on
    stdout."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--home", required=True, help="run store directory")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline", help="baseline run (id, name or 'last')")
    which.add_argument("--experiment", type=int, help="an experiment created beforehand")
    parser.add_argument("--fixes", help="comma-separated fix ids (default: recommended)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--allow-numerics", action="store_true")
    parser.add_argument("--keep-explicit", action="store_true")
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # between trials; during one the launcher forwards it

    signal.signal(signal.SIGTERM, stop)
    with RunStore(args.home) as store:
        run: Any = run_experiment
        if args.experiment is not None:
            row = store.experiment(args.experiment)
            cfg = row["config"]
            options = {
                "baseline_run_id": int(row["baseline_run_id"]),
                "fixes": cfg.get("fixes"),
                "steps": int(cfg.get("steps") or DEFAULT_STEPS),
                "trials": int(cfg.get("trials") or DEFAULT_TRIALS),
                "timeout_s": cfg.get("timeout_s"),
                "allow_numerics": bool(cfg.get("allow_numerics")),
                "keep_explicit": bool(cfg.get("keep_explicit")),
                "output_tolerance": cfg.get("output_tolerance"),
                "min_agreement": cfg.get("min_agreement"),
                "draft_model": cfg.get("draft_model"),
                "budget_min": cfg.get("budget_min"),
                "full": bool(cfg.get("full")),
                "experiment_id": args.experiment,
            }
            if cfg.get("kind") == SWEEP_KIND:
                run = run_sweep
                options = {
                    "baseline_run_id": int(row["baseline_run_id"]),
                    "factors": cfg.get("factors"),
                    "steps": int(cfg.get("steps") or DEFAULT_STEPS),
                    "trials": int(cfg.get("trials") or DEFAULT_TRIALS),
                    "timeout_s": cfg.get("timeout_s"),
                    "experiment_id": args.experiment,
                }
        else:
            options = {
                "baseline_run_id": store.resolve_run(args.baseline),
                "fixes": args.fixes.split(",") if args.fixes else None,
                "steps": args.steps,
                "trials": args.trials,
                "timeout_s": args.timeout,
                "allow_numerics": args.allow_numerics,
                "keep_explicit": args.keep_explicit,
            }
        try:
            result = run(store, **options)
        except KeyboardInterrupt:
            return 130
        except (ValueError, ExperimentError) as exc:
            if args.experiment is not None:  # failed before run_experiment could say so
                with contextlib.suppress(Exception):
                    if store.experiment(args.experiment)["status"] == "running":
                        store.update_experiment(
                            args.experiment, status="failed", error=str(exc), ended_at=time.time()
                        )
            print(f"stepscope: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(result, indent=1))
    return 0


__all__ = ["cancel_experiment", "main", "start_experiment", "start_sweep"]

if __name__ == "__main__":
    sys.exit(main())
