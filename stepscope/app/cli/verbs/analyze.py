"""`stepscope analyze`: Kineto traces (files, folders, s3:// URIs or runs), analysed."""

from __future__ import annotations

import argparse
import os
from typing import Any


def register(sub: Any) -> None:
    analyze = sub.add_parser("analyze", help="analyse Kineto traces (files, folders or runs)")
    analyze.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace files, folders, s3:// URIs, or run ids"
    )
    analyze.add_argument("--json", action="store_true", help="print JSON")
    analyze.add_argument("--top", type=int, default=10, help="rows in the kernel/operator tables")
    analyze.add_argument(
        "--no-save", action="store_true", help="do not save the findings of runs to the store"
    )
    analyze.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="analyse the ranks in N processes (default: one per core, at most one per "
        "trace; 1 for a job of a few MB)",
    )
    analyze.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=os.environ.get("STEPSCOPE_RAY") or None,
        help="analyse each rank as a task on this Ray cluster: auto, HOST:6379, "
        "ray://HOST:10001 (default $STEPSCOPE_RAY)",
    )
    analyze.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.analyze import cmd_analyze  # local: see verbs/__init__.py

    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be 1 or more")
    return cmd_analyze(
        args.paths,
        as_json=args.json,
        top=args.top,
        save=not args.no_save,
        workers=args.workers,
        ray_address=args.ray,
    )
