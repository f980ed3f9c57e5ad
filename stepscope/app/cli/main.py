"""The `stepscope` command: its global options, and the dispatch of each verb.

Each verb registers itself (``verbs/``: its parser, and a ``func`` that calls its
module); a verb is a thin shell over a function in the packages below (collectors,
store, analyzers, optimiser), so the dashboard can offer the same actions. A verb's
module is imported only when that verb runs: they import pandas, torch's collectors
and the analyzers, and `stepscope --help` should stay instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from stepscope import __version__
from stepscope.app.cli.exit_codes import EXIT_UNKNOWN_RUN
from stepscope.app.cli.verbs import (
    analyze,
    attach,
    calibrate,
    dashboard,
    demo,
    memory,
    optimize,
    regression,
    run,
    runs,
    trust,
)

# in the order `stepscope --help` lists them
VERBS = (
    run,
    runs,
    analyze,
    memory,
    attach,
    optimize,
    regression,
    demo,
    calibrate,
    dashboard,
    trust,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepscope",
        description="Find out why a PyTorch job is slow, fix it, and prove the fix.",
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    parser.add_argument(
        "--home",
        help="run store directory (default: $STEPSCOPE_HOME or ~/.stepscope)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="the run database: a path, sqlite:///path or postgresql://user@host/db "
        "(default: $STEPSCOPE_STORE, else stepscope.db in the home)",
    )
    parser.add_argument(
        "--artifacts",
        metavar="URL",
        help="where traces, snapshots and logs go: a folder or s3://bucket/prefix "
        "(default: $STEPSCOPE_ARTIFACTS, else the run folder)",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        verb.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    if args.home:
        os.environ["STEPSCOPE_HOME"] = args.home
    # local: `stepscope --help` (which exits in parse_args) never needs the store; a
    # verb that reads it imports it anyway
    from stepscope.store import RunNotFound, StoreError, default_home, resolve_store_url
    from stepscope.store.url import ENV_VAR as STORE_ENV  # local: same

    if args.store is not None:
        try:  # checked here, where a bad URL can still be said in one line
            resolve_store_url(default_home(), args.store)
        except StoreError as exc:
            print(f"stepscope: --store: {exc}", file=sys.stderr)
            return 2
        os.environ[STORE_ENV] = args.store  # the job and the dashboard inherit it
    if args.artifacts is not None:
        # local: uploads' module (shutil, bz2), for the verbs given --artifacts only
        from stepscope.store.artifacts import ARTIFACTS_ENV, ArtifactError, artifact_location

        try:  # checked here, where a bad URL can still be said in one line
            artifact_location(args.artifacts)
        except ArtifactError as exc:
            print(f"stepscope: --artifacts {exc}", file=sys.stderr)
            return 2
        os.environ[ARTIFACTS_ENV] = args.artifacts

    func = getattr(args, "func", None)
    if func is None:
        parser.error(f"unknown verb {args.verb}")
    if args.verb == "run":  # the job's own exit code, outside the mapping below
        return func(args, parser)
    try:
        return func(args, parser)
    except (RunNotFound, StoreError) as exc:  # an unknown run: EXIT_UNKNOWN_RUN, as everywhere
        print(f"stepscope: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_RUN
