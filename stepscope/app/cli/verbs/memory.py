"""`stepscope memory RUN`: where the peak of a run's capture goes."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    mem = sub.add_parser(
        "memory",
        help="where the peak memory of a run's capture goes: by category, module and line",
    )
    mem.add_argument("run", help="run id, name, or 'last'")
    mem.add_argument("--json", action="store_true", help="print JSON")
    mem.set_defaults(func=run_memory)


def run_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.memory import cmd_memory  # local: see verbs/__init__.py

    return cmd_memory(args.run, as_json=args.json)
