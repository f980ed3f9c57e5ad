"""The arguments of `stepscope diff`, `check` and `tag`: comparing runs for regressions.

Kept beside main.py's parser (as optimize_args.py is) so the main parser stays one
screen per verb; the commands themselves live in diff.py, check.py and tag.py.
"""

from __future__ import annotations

from typing import Any


def add_regression_verbs(sub: Any) -> None:
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

    check = sub.add_parser(
        "check",
        help="is RUN measurably slower than a baseline? exit 0 no, 1 yes, 2 cannot tell (CI)",
        description="Exit 1 when even the 95 %% interval's best end of throughput, p50/p99 "
        "latency or tokens/s is beyond --max-slowdown; 2: unknown run or tag, no timed steps.",
    )
    check.add_argument("run", help="run id, name, tag, or 'last'")
    check.add_argument("--against", required=True, metavar="BASELINE", help="run id, name, tag")
    check.add_argument("--max-slowdown", default="5%", help="5%%, 5 %% or 0.05 (default 5%%)")
    check.add_argument("--format", dest="fmt", choices=("text", "markdown", "json"), default="text")
    check.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    check.add_argument("--no-operators", action="store_true", help="no operators that regressed")
    check.add_argument(
        "--runs",
        type=int,
        default=1,
        metavar="N",
        help="judge over each side's newest N runs of its name (the named run and the N-1 "
        "before it): intervals that cover run-to-run spread (default 1)",
    )
    tag = sub.add_parser("tag", help="name a run: tag RUN NAME (moves it), --list, --delete NAME")
    tag.add_argument("run", nargs="?", help="run id, name, tag, or 'last'")
    tag.add_argument("name", nargs="?", help="the tag, e.g. main-baseline")
    tag.add_argument("--list", dest="list_tags", action="store_true", help="list the tags")
    tag.add_argument("--delete", metavar="NAME", help="delete a tag")
    tag.add_argument("--json", action="store_true", help="--list as JSON")
