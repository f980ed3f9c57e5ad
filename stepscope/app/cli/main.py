"""The `stepscope` command: its parser, and the dispatch of each verb to its module.

Each verb is a thin shell over a function in the packages below (collectors, store,
analyzers, optimiser), so the dashboard can offer the same actions. A verb's module
is imported only when that verb runs: they import pandas, torch's collectors and
the analyzers, and `stepscope --help` should stay instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from stepscope import __version__
from stepscope.app.cli.optimize_args import add_optimize, optimize_refusal
from stepscope.app.cli.regression_args import add_regression_verbs
from stepscope.store import RunNotFound, StoreError, default_home, resolve_store_url
from stepscope.store.artifacts import ARTIFACTS_ENV, ArtifactError, artifact_location
from stepscope.store.url import ENV_VAR as STORE_ENV


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

    run = sub.add_parser(
        "run",
        help="run a command under stepscope and record it",
        description="Run an unmodified Python command (script, -m module, torchrun) and record "
        "its steps, system samples and optional profiler captures.",
        usage="stepscope run [options] -- COMMAND [ARGS...]",
    )
    run.add_argument("--name", help="run name (default: the script or module name)")
    run.add_argument("--max-steps", type=int, help="stop the job cleanly after N steps")
    run.add_argument(
        "--profile-at",
        type=int,
        metavar="STEP",
        help="start the capture at STEP (default: once step times settle, from step 3)",
    )
    run.add_argument(
        "--profile-steps", type=int, default=3, metavar="K", help="steps per capture (default 3)"
    )
    run.add_argument(
        "--no-profile", action="store_true", help="no profiler capture (steps and samples only)"
    )
    run.add_argument(
        "--quiet",
        action="store_true",
        help="print only the one 'run N completed' line, no verdict",
    )
    run.add_argument(
        "--sample-interval",
        type=float,
        default=0.5,
        metavar="S",
        help="system sampling interval in seconds (default 0.5)",
    )
    run.add_argument(
        "--run-group",
        metavar="KEY",
        help="join the run of the other launchers given the same KEY (a multi-node job; "
        "default: Slurm's job id, or a multi-node torchrun's rendezvous)",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")

    runs = sub.add_parser("runs", help="list recorded runs")
    runs.add_argument("--json", action="store_true", help="print JSON")

    show = sub.add_parser("show", help="show one run's summary")
    show.add_argument("run", help="run id, name, or 'last'")
    show.add_argument("--json", action="store_true", help="print JSON")

    capture = sub.add_parser("capture", help="ask a running job for a profiler capture")
    capture.add_argument("run", help="run id, name, or 'last'")
    capture.add_argument("--steps", type=int, default=3, help="steps to capture (default 3)")

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

    att = sub.add_parser(
        "attach",
        help="record a process that is already running (no restart, no code change)",
        description="Sample a running Python process from outside (psutil, NVML, py-spy "
        "stacks) into a new run, then diagnose it. Ctrl-C detaches early and keeps the "
        "recording; the process goes on untouched.",
    )
    att.add_argument("pid", nargs="?", type=int, help="the process (see --list)")
    att.add_argument(
        "--duration", type=float, default=30.0, metavar="S", help="seconds to record (default 30)"
    )
    att.add_argument("--name", help="run name (default: attach-<script>-<pid>)")
    att.add_argument(
        "--rate", type=int, default=20, metavar="HZ", help="stack samples per second (default 20)"
    )
    att.add_argument("--list", action="store_true", help="list the processes to attach to")
    att.add_argument("--json", action="store_true", help="print JSON")
    att.add_argument("--quiet", action="store_true", help="no progress and no report")

    add_optimize(sub)

    add_regression_verbs(sub)

    demo = sub.add_parser(
        "demo",
        help="record an example job, diagnose it, apply and compare the fixes, open the dashboard",
        description="The whole loop on examples/input_bound.py, in its own store (default "
        "~/.stepscope-demo, emptied first; or the global --home), then the dashboard on it.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    demo.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --host to be other than the loopback address (as for `dashboard`)",
    )
    demo.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    demo.add_argument("--trials", type=int, default=2, help="trials per arm (default 2)")
    demo.add_argument(
        "--no-dashboard", action="store_true", help="stop after the experiment (no browser)"
    )

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

    dash = sub.add_parser("dashboard", help="open the dashboard in the browser (Streamlit)")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    dash.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow --host to be other than the loopback address (everyone who can reach "
        "the port sees the runs)",
    )
    dash.add_argument(
        "--store",
        dest="dashboard_store",
        metavar="URL",
        help="the run store's database, e.g. postgresql://user@host/db (a team's shared store)",
    )
    dash.add_argument(
        "--require-login",
        action="store_true",
        help="ask people to sign in first (Streamlit's OIDC: [auth] in .streamlit/secrets.toml)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    if args.home:
        os.environ["STEPSCOPE_HOME"] = args.home
    if args.store is not None:
        try:  # checked here, where a bad URL can still be said in one line
            resolve_store_url(default_home(), args.store)
        except StoreError as exc:
            print(f"stepscope: --store: {exc}", file=sys.stderr)
            return 2
        os.environ[STORE_ENV] = args.store  # the job and the dashboard inherit it
    if args.artifacts is not None:
        try:  # checked here, where a bad URL can still be said in one line
            artifact_location(args.artifacts)
        except ArtifactError as exc:
            print(f"stepscope: --artifacts {exc}", file=sys.stderr)
            return 2
        os.environ[ARTIFACTS_ENV] = args.artifacts

    if args.verb == "run":
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        if not command:
            parser.error("run needs a command after --, e.g. stepscope run -- python train.py")
        if args.no_profile and args.profile_at is not None:
            parser.error("--no-profile and --profile-at contradict each other: choose one")
        # local: only `run` needs the launcher (and keeps `stepscope --help` fast)
        from stepscope.collectors.contract import PROFILE_AUTO
        from stepscope.collectors.launcher import launch  # local: same

        run_id, code = launch(
            command,
            name=args.name,
            max_steps=args.max_steps,
            profile_at=None if args.no_profile else (args.profile_at or PROFILE_AUTO),
            profile_steps=args.profile_steps,
            sample_interval=args.sample_interval,
            run_group=args.run_group,
            brief=args.quiet,
        )
        if not args.quiet:
            from stepscope.app.cli.verdict import print_verdict  # local: see above

            print_verdict(run_id)
        return code

    # Each import below is local: a verb's module is loaded only when the verb runs,
    # which keeps `stepscope --help` and the other verbs from importing what it needs.
    try:
        if args.verb == "runs":
            from stepscope.app.cli.runs import cmd_runs  # local: see above

            return cmd_runs(as_json=args.json)
        if args.verb == "show":
            from stepscope.app.cli.show import cmd_show  # local: see above

            return cmd_show(args.run, as_json=args.json)
        if args.verb == "capture":
            from stepscope.app.cli.runs import cmd_capture  # local: see above

            return cmd_capture(args.run, steps=args.steps)
        if args.verb == "analyze":
            from stepscope.app.cli.analyze import cmd_analyze  # local: see above

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
        if args.verb == "diff":
            from stepscope.app.cli.diff import cmd_diff  # local: see above

            return cmd_diff(args.a, args.b, as_json=args.json, top=args.top, kind=args.kind)
        if args.verb == "attach":
            from stepscope.app.cli.attach import cmd_attach  # local: see above

            return cmd_attach(
                args.pid,
                duration=args.duration,
                name=args.name,
                rate=args.rate,
                as_json=args.json,
                list_only=args.list,
                quiet=args.quiet,
            )
        if args.verb == "optimize":
            refused = optimize_refusal(args)
            if refused is not None:  # before anything starts, in one line
                print(f"stepscope: {refused}", file=sys.stderr)
                return 2
            from stepscope.app.cli.optimize import cmd_optimize  # local: see above

            return cmd_optimize(
                args.run,
                fixes=args.fixes,
                steps=args.steps,
                trials=args.trials,
                timeout=args.timeout,
                stall=args.stall,
                allow_numerics=args.allow_numerics,
                as_json=args.json,
                keep_explicit=args.keep_explicit,
                output_tolerance=args.output_tolerance,
                min_agreement=args.min_agreement,
                sweep=args.sweep,
                batch_factors=args.batch_factors,
                draft_model=args.draft_model,
                budget=args.budget,
                full=args.full,
            )
        if args.verb == "check":
            from stepscope.app.cli.check import cmd_check  # local: see above

            return cmd_check(
                args.run, args.against, args.max_slowdown, args.fmt, args.junit,
                operators=not args.no_operators, runs=args.runs,
            )  # fmt: skip
        if args.verb == "tag":
            from stepscope.app.cli.tag import cmd_tag  # local: see above

            return cmd_tag(args.run, args.name, list_tags=args.list_tags, delete=args.delete,
                           as_json=args.json)  # fmt: skip
        if args.verb == "demo":
            from stepscope.app.cli.dashboard import bind_refusal  # local: see above
            from stepscope.app.cli.demo import cmd_demo  # local: see above

            refused = None if args.no_dashboard else bind_refusal(args.host, args.allow_remote)
            if refused is not None:  # say so now, not after the whole experiment
                print(f"stepscope: {refused}", file=sys.stderr)
                return 2
            return cmd_demo(
                home=args.home,
                host=args.host,
                port=args.port,
                steps=args.steps,
                trials=args.trials,
                dashboard=not args.no_dashboard,
                allow_remote=args.allow_remote,
            )
        if args.verb == "calibrate":
            from stepscope.app.cli.calibrate import cmd_calibrate  # local: see above

            return cmd_calibrate(
                dtype=args.dtype, threads=args.threads, seconds=args.seconds, as_json=args.json
            )
        if args.verb == "dashboard":
            from stepscope.app.cli.dashboard import cmd_dashboard  # local: see above

            return cmd_dashboard(
                host=args.host,
                port=args.port,
                allow_remote=args.allow_remote,
                store=args.dashboard_store,
                require_login=args.require_login,
            )
    except (RunNotFound, StoreError) as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 1
    parser.error(f"unknown verb {args.verb}")
    return 2
