"""`stepscope attach`: record a process that is already running, from outside."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    att = sub.add_parser(
        "attach",
        help="record a process that is already running (no restart, no code change)",
        description="Record a running Python process into a new run, then diagnose it: "
        "from outside (psutil, NVML, py-spy stacks), and with stepscope run's collectors "
        "put into it through gdb where that can be done (steps, requests, captures). "
        "Ctrl-C detaches early and keeps the recording; the process goes on.",
    )
    att.add_argument("pid", nargs="?", type=int, help="the process (see --list)")
    att.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="seconds to record (default 30)"
    )
    att.add_argument("--name", help="run name (default: attach-<script>-<pid>)")
    att.add_argument(
        "--rate", type=int, default=20, metavar="HZ", help="stack samples per second (default 20)"
    )
    att.add_argument(
        "--no-inject",
        action="store_true",
        help="record from outside only (by default stepscope run's collectors go into the "
        "process for the attach's time, through gdb: its steps, requests and captures)",
    )
    att.add_argument("--list", action="store_true", help="list the processes to attach to")
    att.add_argument("--json", action="store_true", help="print JSON")
    att.add_argument("--quiet", action="store_true", help="no progress and no report")
    att.set_defaults(func=run_attach)


def run_attach(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.attach import cmd_attach  # local: see verbs/__init__.py

    return cmd_attach(
        args.pid,
        duration=args.duration,
        name=args.name,
        rate=args.rate,
        as_json=args.json,
        list_only=args.list,
        quiet=args.quiet,
        inject=not args.no_inject,
    )
