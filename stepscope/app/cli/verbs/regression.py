"""`stepscope diff`, `check` and `tag`: comparing runs for regressions.

Their arguments, and the calls of the commands, which live in ``cli/diff.py``,
``check.py`` and ``tag.py``.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """``diff`` (where the time went), ``check`` (a CI gate) and ``tag`` (baselines)."""
    diff = sub.add_parser(
        "diff", help="what changed between two runs, operator by operator, with intervals"
    )
    diff.add_argument("a", metavar="A", help="the baseline: a run (id, name, last) or traces")
    diff.add_argument("b", metavar="B", help="the run (or traces) to compare with A")
    diff.add_argument("--json", action="store_true", help="print JSON")
    diff.add_argument("--top", type=int, default=15, help="rows of the operator table")
    diff.add_argument(
        "--kind", choices=("operator", "kernel"), help="only operators, or only kernels"
    )
    diff.set_defaults(func=run_diff)

    check = sub.add_parser(
        "check",
        help="is RUN measurably slower than a baseline? exit 0 no, 1 yes, 2 cannot tell (CI)",
        description="Exit 1 when even the 95 %% interval's best end of throughput, p50/p99 "
        "latency or tokens/s is beyond --max-slowdown, or when the run does more work per "
        "step; 2: unknown run or tag, no timed steps. Time is judged only by intervals that "
        "contain run-to-run spread: over 3+ runs of each side's name, or one run widened by "
        "the host's spread (earlier runs of the names, or `stepscope calibrate --noise`); "
        "else the check is inconclusive (exit 0 with a warning, 3 with --inconclusive fail).",
    )
    check.add_argument("run", help="run id, name, tag, or 'last'")
    check.add_argument("--against", required=True, metavar="BASELINE", help="run id, name, tag")
    check.add_argument("--max-slowdown", default="5%", help="5%%, 5 %% or 0.05 (default 5%%)")
    check.add_argument("--format", dest="fmt", choices=("text", "markdown", "json"), default="text")
    check.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    check.add_argument("--no-operators", action="store_true", help="no operators that regressed")
    check.add_argument(
        "--runs",
        default="auto",
        metavar="N",
        help="judge over each side's newest N runs of its name (the named run and the N-1 "
        "before it); default auto: up to 5, when each side has 3; 1: one against one",
    )
    check.add_argument(
        "--inconclusive",
        choices=("pass", "fail"),
        default="pass",
        help="what a check that cannot judge time (one run a side, no spread known) does: "
        "pass with a warning (exit 0, default) or fail (exit 3)",
    )
    check.set_defaults(func=run_check)
    tag = sub.add_parser("tag", help="name a run: tag RUN NAME (moves it), --list, --delete NAME")
    tag.add_argument("run", nargs="?", help="run id, name, tag, or 'last'")
    tag.add_argument("name", nargs="?", help="the tag, e.g. main-baseline")
    tag.add_argument("--list", dest="list_tags", action="store_true", help="list the tags")
    tag.add_argument("--delete", metavar="NAME", help="delete a tag")
    tag.add_argument("--json", action="store_true", help="--list as JSON")
    tag.set_defaults(func=run_tag)


def run_diff(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.diff import cmd_diff  # local: see verbs/__init__.py

    return cmd_diff(args.a, args.b, as_json=args.json, top=args.top, kind=args.kind)


def run_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.check import cmd_check  # local: see verbs/__init__.py

    return cmd_check(
        args.run, args.against, args.max_slowdown, args.fmt, args.junit,
        operators=not args.no_operators, runs=args.runs, inconclusive=args.inconclusive,
    )  # fmt: skip


def run_tag(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.tag import cmd_tag  # local: see verbs/__init__.py

    return cmd_tag(args.run, args.name, list_tags=args.list_tags, delete=args.delete,
                   as_json=args.json)  # fmt: skip
