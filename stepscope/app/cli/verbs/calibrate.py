"""`stepscope calibrate`: this host's FLOP/s and bandwidth, or its run-to-run spread."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="measure this host's matmul FLOP/s and memory bandwidth (a few seconds) and cache it",
        description="Measure matmul FLOP/s at the given dtype and thread count and a "
        "stream-like memory bandwidth (copy, triad), and cache the figures per host in the "
        "store directory: the peak that CPU jobs' ratios are shown against.",
    )
    cal.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    cal.add_argument(
        "--threads", type=int, metavar="N", help="torch threads (default: torch's default)"
    )
    cal.add_argument(
        "--seconds", type=float, default=3.0, metavar="S", help="time budget (default 3)"
    )
    cal.add_argument("--json", action="store_true", help="print JSON")
    cal.add_argument(
        "--noise",
        action="store_true",
        help="instead: this host's run-to-run spread, from whole runs of a small fixed job "
        "(what `stepscope check` widens a one-run side's interval by)",
    )
    cal.add_argument("--runs", type=int, default=5, metavar="N", help="--noise: runs (default 5)")
    cal.add_argument(
        "--steps", type=int, default=300, metavar="N", help="--noise: steps a run (default 300)"
    )
    cal.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # local: see verbs/__init__.py
    from stepscope.app.cli.calibrate import cmd_calibrate, cmd_calibrate_noise

    if args.noise:
        return cmd_calibrate_noise(args.runs, args.steps, args.threads, args.json)
    return cmd_calibrate(
        dtype=args.dtype, threads=args.threads, seconds=args.seconds, as_json=args.json
    )
