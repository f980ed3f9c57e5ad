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
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.optim_runner.experiment.experiment import (
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    ExperimentError,
    ExperimentOptions,
    check_size,
    process_started_at,
    run_experiment,
)
from stepscope.optim_runner.sweeps.memory_curves import memory_curve_fixes
from stepscope.optim_runner.sweeps.sweep import SWEEP_KIND, check_sweepable, run_sweep
from stepscope.optim_runner.sweeps.sweep_figures import FIX_ID
from stepscope.optim_runner.trials import plan as planning
from stepscope.optim_runner.trials.trials import check_replayable
from stepscope.store import RunStore
from stepscope.store.liveness import EXPERIMENT_PROCESS, signalable_pid

MODULE = "stepscope.optim_runner.background"


def start_experiment(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    options: ExperimentOptions | None = None,
) -> int:
    """Start an experiment in a background process; returns its id at once.

    The fixes are chosen here, in the caller, so that a request with nothing to try
    (or an unknown fix id) fails as a ValueError rather than in a process nobody
    watches. Progress and result are read with ``RunStore.experiment(id)``; the
    process's own output goes to ``<home>/experiments/<id>.log``; it reads every option
    from ``<home>/experiments/<id>.json`` (``ExperimentOptions.to_json``).
    """
    options = options or ExperimentOptions()
    options.check()
    with RunStore(home) as store:
        fixes = None if options.fixes is None else list(options.fixes)
        planned = planning.choose_fixes(
            store, baseline_run_id, fixes, options.allow_numerics, options.draft_model
        )
        if not planned:
            raise ValueError(f"no automatic fix is recommended for run {baseline_run_id}")
        chosen = dataclasses.replace(options, fixes=tuple(f.id for f in planned))
        return _spawn(store, baseline_run_id, chosen.to_json())


def start_sweep(
    home: str | os.PathLike[str],
    baseline_run_id: int,
    *,
    factors: list[int] | tuple[int, ...] | None = None,
    steps: int = DEFAULT_STEPS,
    trials: int = DEFAULT_TRIALS,
    timeout_s: float | None = None,
    memory_limit: int | None = None,
    memory_fixes: list[str] | None = None,
) -> int:
    """Start a batch-size sweep in a background process; returns its experiment id at
    once (a run that cannot be swept fails here, as a ValueError in one line).
    ``memory_limit``: bytes a training job's largest batch must fit in; ``memory_fixes``:
    one more curve each (``run_sweep``)."""
    check_size(steps, trials)
    memory_fixes = memory_curve_fixes(memory_fixes)
    with RunStore(home) as store:
        check_sweepable(store, baseline_run_id, memory_limit)
        config = {
            "kind": SWEEP_KIND,
            "sweep": "batch",
            "factors": sorted({int(f) for f in factors} | {1}) if factors else None,
            "fixes": [FIX_ID],
            "steps": steps,
            "trials": trials,
            "timeout_s": timeout_s,
            "memory_limit": memory_limit,
            "memory_fixes": memory_fixes,
        }
        return _spawn(store, baseline_run_id, config)


def _spawn(store: RunStore, baseline_run_id: int, config: dict[str, Any]) -> int:
    """Create the experiment's row and start ``main`` on it in a session of its own (it
    outlives the dashboard's request, not its signals); its output goes to
    ``<home>/experiments/<id>.log``."""
    check_replayable(store.run(baseline_run_id))  # before a row or a process exists
    experiment_id = store.create_experiment(baseline_run_id, config)
    store.update_experiment(experiment_id, progress={"event": "starting", "done": 0})
    log_dir = store.home / "experiments"
    log_dir.mkdir(parents=True, exist_ok=True)
    # The process reads what to run from this local file, never from the row: a shared
    # store's row could be rewritten (a draft model's path, the fixes) before it reads it.
    (log_dir / f"{experiment_id}.json").write_text(
        json.dumps({"baseline_run_id": baseline_run_id, "config": config})
    )
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
    pid = signalable_pid(row, EXPERIMENT_PROCESS) if row["status"] == "running" else None
    if pid is None:  # ended, or not a process of this host (a shared store)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _spawned(home: Path, experiment_id: int) -> dict[str, Any]:
    """What ``_spawn`` asked this process to run (its local file, not the store's row)."""
    path = Path(home) / "experiments" / f"{int(experiment_id)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"experiment {experiment_id}: no request from this home ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m stepscope.optim_runner.background``: run one experiment, result on
    stdout."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--home", required=True, help="run store directory")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline", help="baseline run (id, name or 'last')")
    which.add_argument("--experiment", type=int, help="an experiment created beforehand")
    ExperimentOptions.add_arguments(parser)  # as `stepscope optimize` has them
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # between trials; during one the launcher forwards it

    signal.signal(signal.SIGTERM, stop)
    with RunStore(args.home) as store:
        if args.experiment is not None:
            try:
                row = _spawned(store.home, args.experiment)
            except ValueError as exc:
                print(f"stepscope: {exc}", file=sys.stderr)
                return 1
            cfg = row["config"]
            base_id = int(row["baseline_run_id"])
            if cfg.get("kind") == SWEEP_KIND:
                run: Callable[[], dict[str, Any]] = functools.partial(
                    run_sweep,
                    store,
                    base_id,
                    factors=cfg.get("factors"),
                    steps=int(cfg.get("steps") or DEFAULT_STEPS),
                    trials=int(cfg.get("trials") or DEFAULT_TRIALS),
                    timeout_s=cfg.get("timeout_s"),
                    experiment_id=args.experiment,
                    memory_limit=cfg.get("memory_limit"),
                    fixes=cfg.get("memory_fixes") or None,  # checked again by run_sweep
                )
            else:
                try:
                    options = ExperimentOptions.from_json(cfg)
                except (TypeError, ValueError) as exc:
                    return _refused(store, args.experiment, f"experiment {args.experiment}: {exc}")
                run = functools.partial(
                    run_experiment, store, base_id, options, experiment_id=args.experiment
                )
        else:
            run = functools.partial(
                run_experiment,
                store,
                store.resolve_run(args.baseline),
                ExperimentOptions.from_args(args),
            )
        try:
            result = run()
        except KeyboardInterrupt:
            return 130
        except (ValueError, ExperimentError) as exc:
            return _refused(store, args.experiment, str(exc))
    print(json.dumps(result, indent=1))
    return 0


def _refused(store: RunStore, experiment_id: int | None, why: str) -> int:
    """Exit 1 with ``why`` on stderr; a row still running (the process failed before
    ``run_experiment`` could say so) is marked failed with it."""
    if experiment_id is not None:
        with contextlib.suppress(Exception):
            if store.experiment(experiment_id)["status"] == "running":
                store.update_experiment(
                    experiment_id, status="failed", error=why, ended_at=time.time()
                )
    print(f"stepscope: {why}", file=sys.stderr)
    return 1


__all__ = ["cancel_experiment", "main", "start_experiment", "start_sweep"]

if __name__ == "__main__":
    sys.exit(main())
