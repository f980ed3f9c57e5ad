"""`stepscope run`: record an unmodified command (its steps, samples and captures)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.app.cli.sizes import parse_size


def register(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run a command under stepscope and record it",
        description="Run an unmodified Python command (script, -m module, torchrun) and record "
        "its steps, system samples and optional profiler captures.",
        usage="stepscope run [options] -- COMMAND [ARGS...]",
    )
    run.add_argument("--name", help="run name (default: the script or module name)")
    run.add_argument("--max-steps", type=int, help="stop the job cleanly after N steps")
    run.add_argument(
        "--profile-at",
        type=int,
        metavar="STEP",
        help="start the capture at STEP (default: once step times settle, from step 3)",
    )
    run.add_argument(
        "--profile-steps", type=int, default=3, metavar="K", help="steps per capture (default 3)"
    )
    run.add_argument(
        "--no-profile", action="store_true", help="no profiler capture (steps and samples only)"
    )
    run.add_argument(
        "--quiet",
        action="store_true",
        help="print only the one 'run N completed' line, no verdict",
    )
    run.add_argument(
        "--sample-interval",
        type=float,
        default=0.5,
        metavar="S",
        help="system sampling interval in seconds (default 0.5)",
    )
    run.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="cap the job's memory (its address space, RLIMIT_AS), e.g. 2.5GB or 2500MiB; "
        "an experiment's trials run under the same cap",
    )
    run.add_argument(
        "--run-group",
        metavar="KEY",
        help="join the run of the other launchers given the same KEY (a multi-node job; "
        "default: Slurm's job id, or a multi-node torchrun's rendezvous)",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    run.set_defaults(func=run_command)


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("run needs a command after --, e.g. stepscope run -- python train.py")
    if args.no_profile and args.profile_at is not None:
        parser.error("--no-profile and --profile-at contradict each other: choose one")
    memory_limit = None
    if args.memory_limit is not None:
        try:
            memory_limit = parse_size(args.memory_limit)
        except ValueError as exc:
            print(f"stepscope: --memory-limit: {exc}", file=sys.stderr)
            return 2
    # local: only `run` needs the launcher (and keeps `stepscope --help` fast)
    from stepscope.collectors.launch.contract import PROFILE_AUTO
    from stepscope.collectors.launch.launcher import launch  # local: same

    run_id, code = launch(
        command,
        name=args.name,
        max_steps=args.max_steps,
        profile_at=None if args.no_profile else (args.profile_at or PROFILE_AUTO),
        profile_steps=args.profile_steps,
        sample_interval=args.sample_interval,
        run_group=args.run_group,
        memory_limit=memory_limit,
        brief=args.quiet,
    )
    if not args.quiet:
        from stepscope.app.cli.show_kept import keep_show_figures  # local: see above
        from stepscope.app.cli.verdict import print_verdict  # local: same

        print_verdict(run_id)
        keep_show_figures(run_id)  # after the verdict: the first `show` reads them
    return code
