"""`stepscope optimize`'s arguments, and the ones refused before anything starts.

Apart from ``main.py`` so that the parser stays readable there; no heavy import here
(``stepscope --help`` stays instant): the defaults come from ``optim_runner.adaptive``,
a module of plain functions.
"""

from __future__ import annotations

import argparse
from typing import Any

from stepscope.optim_runner.adaptive import DEFAULT_BUDGET_MIN, MIN_TRIALS, check_budget


def add_optimize(sub: Any) -> None:
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
    opt.add_argument("--fixes", metavar="ID,...", help="fixes to try (default: recommended)")
    opt.add_argument("--steps", type=int, default=30, help="steps per trial (default 30)")
    opt.add_argument(
        "--trials",
        type=int,
        default=3,
        help="most trials per arm (default 3); an arm whose verdict is clear after "
        f"{MIN_TRIALS} trial{'' if MIN_TRIALS == 1 else 's'} stops early, unless --full",
    )
    opt.add_argument(
        "--budget",
        type=float,
        metavar="MINUTES",
        help="end the experiment with what it has rather than start a round that would end "
        f"past MINUTES (default {DEFAULT_BUDGET_MIN:g})",
    )
    opt.add_argument(
        "--full",
        action="store_true",
        help="every candidate gets every trial (no early stops, no budget): the fixed design",
    )
    opt.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds before a trial counts as hung (default: 5x the baseline, >= 60)",
    )
    opt.add_argument(
        "--stall",
        type=float,
        metavar="S",
        help="seconds without a new step, once a trial has stepped, before it counts as "
        "hung (default: 10x the baseline's longest wait between steps, >= 60)",
    )
    opt.add_argument(
        "--allow-numerics",
        action="store_true",
        help="also try fixes that change what the model computes (e.g. larger_batch)",
    )
    opt.add_argument(
        "--keep-explicit",
        action="store_true",
        help="keep values the script set explicitly (num_workers=0 passed by the script "
        "stays 0); by default a fix overrides them and the trial's log says what it replaced",
    )
    opt.add_argument(
        "--output-tolerance",
        type=float,
        metavar="R",
        help="inference jobs: largest difference of a regression output from the baseline's, "
        "relative to its scale (default 0.01)",
    )
    opt.add_argument(
        "--min-agreement",
        type=float,
        metavar="A",
        help="inference jobs: least share of rows whose top-1 class is the baseline's "
        "(default 0.99)",
    )
    opt.add_argument(
        "--draft-model",
        metavar="PATH",
        help="generation jobs: a smaller model sharing the tokenizer (a from_pretrained "
        "folder); speculative decoding is tried with it, greedy tokens must stay the same",
    )
    opt.add_argument(
        "--sweep",
        choices=("batch",),
        help="instead of fixes: re-run an inference job at several batch sizes (a generation "
        "job: its own requests' prompts, batched) and report throughput and p99 latency per "
        "batch size (no --allow-numerics needed)",
    )
    opt.add_argument(
        "--batch-factors",
        metavar="F,...",
        help="with --sweep batch: factors of the job's batch size (default 1,2,4,8); for a "
        "generation job the batch sizes (default 1,2,4,8,16), and --steps the requests replayed",
    )
    opt.add_argument("--json", action="store_true", help="print JSON")


def optimize_refusal(args: argparse.Namespace) -> str | None:
    """One line that says why these arguments cannot run (exit 2), or None."""
    if args.sweep is not None and (args.budget is not None or args.full):
        return "--budget and --full are for experiments with fixes, not --sweep"
    try:
        check_budget(args.budget, args.full)
    except ValueError as exc:
        return str(exc)
    return None


__all__ = ["add_optimize", "optimize_refusal"]
