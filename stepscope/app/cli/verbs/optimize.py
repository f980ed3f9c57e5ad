"""`stepscope optimize`: its arguments, the ones refused before anything starts, and
the call of ``cli/optimize.py``.

The experiment's own arguments are its options' fields (``ExperimentOptions``,
``optim_runner/experiment/options.py``); the rest (``--sweep``, ``--json``) is this
verb's. No heavy import here (``stepscope --help`` stays instant): ``options.py`` and
``adaptive.py`` are modules of plain functions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.app.cli.sizes import parse_size
from stepscope.optim_runner.experiment.adaptive import check_budget
from stepscope.optim_runner.experiment.options import ExperimentOptions, check_size


def register(sub: Any) -> None:
    """The ``optimize`` verb on ``sub`` (the subparsers of ``main.build_parser``)."""
    opt = sub.add_parser(
        "optimize",
        help="re-run a run with fixes applied and measure the gain",
        description="Re-run the run's command as a baseline and with the recommended fixes "
        "(together and one by one), interleaved, and report each fix's measured speed-up "
        # argparse %-formats a description only when it holds %(prog): one % here
        "with a 95 % confidence interval and whether the loss stayed the same. Trials run in "
        "rounds; an arm whose verdict is already clear stops, and the experiment ends when "
        "the best candidate is clear, every candidate is decided, or the budget is spent.",
    )
    opt.add_argument("run", help="run id, name, or 'last'")
    ExperimentOptions.add_arguments(opt)  # --fixes ... --draft-model: options.py
    opt.add_argument(
        "--sweep",
        choices=("batch",),
        help="instead of fixes: re-run the job at several batch sizes and report throughput, "
        "p99 latency and peak memory per batch size (a generation job: its own requests' "
        "prompts, batched; a training job: also the largest batch that fits in memory, "
        "predicted and confirmed by a run)",
    )
    opt.add_argument(
        "--batch-factors",
        metavar="F,...",
        help="with --sweep batch: factors of the job's batch size (default 1,2,4,8); for a "
        "generation job the batch sizes (default 1,2,4,8,16), and --steps the requests replayed",
    )
    opt.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="with --sweep batch on a CPU training job: the memory (address space, e.g. 2.5GB) "
        "every trial runs under and the largest batch must fit in (default: the run's own "
        "--memory-limit; a GPU job's limit is its device's memory)",
    )
    opt.add_argument("--json", action="store_true", help="print JSON")
    opt.set_defaults(func=run_optimize)


def optimize_refusal(args: argparse.Namespace) -> str | None:
    """One line that says why these arguments cannot run (exit 2), or None."""
    if args.sweep is not None and (args.budget_min is not None or args.full):
        return "--budget and --full are for experiments with fixes, not --sweep"
    if args.memory_limit is not None:
        if args.sweep is None:
            return (
                "--memory-limit is for --sweep batch (an experiment's trials run under the run's)"
            )
        try:
            parse_size(args.memory_limit)
        except ValueError as exc:
            return f"--memory-limit: {exc}"
    if args.max_slowdown is not None and args.goal != "memory":
        return "--max-slowdown is for --goal memory"
    try:
        check_budget(args.budget_min, args.full)
        check_size(args.steps, args.trials)
    except ValueError as exc:
        return str(exc)
    return None


def run_optimize(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    refused = optimize_refusal(args)
    if refused is not None:  # before anything starts, in one line
        print(f"stepscope: {refused}", file=sys.stderr)
        return 2
    from stepscope.app.cli.optimize import cmd_optimize  # local: see verbs/__init__.py

    return cmd_optimize(
        args.run,
        ExperimentOptions.from_args(args),
        as_json=args.json,
        sweep=args.sweep,
        batch_factors=args.batch_factors,
        memory_limit=parse_size(args.memory_limit) if args.memory_limit else None,
    )


__all__ = ["optimize_refusal", "register"]
