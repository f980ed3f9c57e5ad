"""`stepscope runs`, `show` and `capture`: the recorded runs, one run, a running job."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list recorded runs")
    runs.add_argument("--json", action="store_true", help="print JSON (every run)")
    runs.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="the newest N runs (default: the table 50, --json every run)",
    )
    runs.add_argument("--all", action="store_true", help="every run in the table")
    runs.set_defaults(func=run_runs)

    show = sub.add_parser("show", help="show one run's summary")
    show.add_argument("run", help="run id, name, or 'last'")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=run_show)

    capture = sub.add_parser("capture", help="ask a running job for a profiler capture")
    capture.add_argument("run", help="run id, name, or 'last'")
    capture.add_argument("--steps", type=int, default=3, help="steps to capture (default 3)")
    capture.set_defaults(func=run_capture)


def run_runs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.runs import cmd_runs  # local: see verbs/__init__.py

    return cmd_runs(as_json=args.json, limit=args.limit, every=args.all)


def run_show(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.show import cmd_show  # local: see verbs/__init__.py

    return cmd_show(args.run, as_json=args.json)


def run_capture(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.runs import cmd_capture  # local: see verbs/__init__.py

    return cmd_capture(args.run, steps=args.steps)
