"""`stepscope trust`: sign a run's command after reading it, so that it may be re-run."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    trust = sub.add_parser(
        "trust",
        help="sign a run's command after reading it, so that stepscope may re-run it",
        description="Show what re-running the run would start (command, folder, variables) "
        "and, on your yes at a terminal, sign it with your key (~/.config/stepscope/key). "
        "Only your own runs on this host; needed for runs recorded before runs were signed.",
    )
    trust.add_argument("run", help="run id, name, tag, or 'last'")
    trust.set_defaults(func=run_trust)


def run_trust(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from stepscope.app.cli.trust import cmd_trust  # local: see verbs/__init__.py

    return cmd_trust(args.run)
