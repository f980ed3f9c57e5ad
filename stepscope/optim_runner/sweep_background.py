"""A batch-size sweep in a background process, followed through the store (the dashboard).

As ``background.py`` does for experiments: ``start_sweep`` checks the run and creates the
experiment row in the caller (a run that cannot be swept fails there, in one line), then
starts ``python -m stepscope.optim_runner.sweep_background`` on it in its own session;
``background.cancel_experiment`` stops it with SIGTERM, which ends its running trial.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stepscope.optim_runner.experiment import (
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    ExperimentError,
    check_size,
    process_started_at,
)
from stepscope.optim_runner.sweep import DEFAULT_FACTORS, SWEEP_KIND, check_sweepable, run_sweep
from stepscope.optim_runner.sweep_figures import FIX_ID
from stepscope.store import RunStore

MODULE = "stepscope.optim_runner.sweep_background"


def start_sweep(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    *,
    factors: list[int] | tuple[int, ...] = DEFAULT_FACTORS,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
) -> int:
    """Start a sweep in a process of its own; returns its experiment id at once (checks
    first, so that a run that cannot be swept fails here as a ValueError)."""
    check_size(steps, trials)
    factors = sorted({int(f) for f in factors} | {1})
    with RunStore(home) as store:
        check_sweepable(store, baseline_run_id)
        config = {
            "kind": SWEEP_KIND,
            "sweep": "batch",
            "factors": factors,
            "fixes": [FIX_ID],
            "steps": steps,
            "trials": trials,
            "timeout_s": timeout_s,
        }
        experiment_id = store.create_experiment(baseline_run_id, config)
        store.update_experiment(experiment_id, progress={"event": "starting", "done": 0})
        log_dir = store.home / "experiments"
        log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", MODULE, "--home", str(store.home)]
        cmd += ["--experiment", str(experiment_id)]
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
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


def main(argv: list[str] | None = None) -> int:
    """``python -m stepscope.optim_runner.sweep --home H --experiment E``: run a sweep
    created by ``start_sweep``; its result on stdout."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--home", required=True)
    parser.add_argument("--experiment", type=int, required=True)
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # between trials; during one the launcher forwards it

    signal.signal(signal.SIGTERM, stop)
    with RunStore(args.home) as store:
        row = store.experiment(args.experiment)
        cfg = row["config"]
        try:
            result = run_sweep(
                store,
                int(row["baseline_run_id"]),
                factors=cfg.get("factors") or DEFAULT_FACTORS,
                steps=int(cfg.get("steps") or DEFAULT_STEPS),
                trials=int(cfg.get("trials") or DEFAULT_TRIALS),
                timeout_s=cfg.get("timeout_s"),
                experiment_id=args.experiment,
            )
        except KeyboardInterrupt:
            return 130
        except (ValueError, ExperimentError) as exc:
            if store.experiment(args.experiment)["status"] == "running":
                store.update_experiment(
                    args.experiment, status="failed", error=str(exc), ended_at=time.time()
                )
            print(f"stepscope: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(result, indent=1))
    return 0


__all__ = ["main", "start_sweep"]

if __name__ == "__main__":
    sys.exit(main())
