"""`stepscope demo`: the whole loop on an example job, then the dashboard on it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepscope.app.cli.verbs.dashboard import access_of, add_access_options


def register(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="record an example job, diagnose it, apply and compare the fixes, open the dashboard",
        description="The whole loop on examples/input_bound.py, in its own store (default "
        "~/.stepscope-demo, emptied first; or the global --home), then the dashboard on it.",
    )
    demo.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    add_access_options(demo)
    demo.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    demo.add_argument("--trials", type=int, default=2, help="trials per arm (default 2)")
    demo.add_argument(
        "--no-dashboard", action="store_true", help="stop after the experiment (no browser)"
    )
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.dashboard import access_refusal  # local: see verbs/__init__.py
    from stepscope.app.cli.demo import cmd_demo  # local: same

    access = access_of(args)
    refused = None if args.no_dashboard else access_refusal(access)
    if refused is not None:  # say so now, not after the whole experiment
        print(f"stepscope: {refused}", file=sys.stderr)
        return 2
    return cmd_demo(
        home=args.home,
        access=access,
        port=args.port,
        steps=args.steps,
        trials=args.trials,
        dashboard=not args.no_dashboard,
    )
