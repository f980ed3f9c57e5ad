"""`stepscope runs` and `stepscope capture RUN`.

The JSON form of `runs` is the contract (tests and scripts read it); the table is the
same data for people, built from one dict per run (``run_row``), so they cannot
disagree. A run's figures are those kept in the store once it ended
(``analyzers/steps/run_figures.py``): a list of thousands of runs reads them with one
query instead of summarising every run's steps. `stepscope show` (one run) is ``show.py``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from stepscope.analyzers.steps.run_figures import compute_figures, kept_figures, run_states
from stepscope.app.cli import term
from stepscope.app.cli.exit_codes import EXIT_REFUSED
from stepscope.app.cli.findings_output import finding_text
from stepscope.app.cli.term import esc, print_json, status_text
from stepscope.app.formats import fmt_s, fmt_time, missing
from stepscope.store import RunStore

#: the table's rows when no --limit is given: the newest runs
TABLE_ROWS = 50
#: ended runs whose figures a list computes (the first list after an upgrade, a store
#: that many runs ended in since) from which it says so first, on stderr
SAY_COMPUTING_FROM = 100


def run_row(run: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The fields `runs` lists for one run (a row of ``store.run_rows()`` or of
    ``store.run_list()``, and its figures)."""
    run = {k: None if missing(v) else v for k, v in run.items()}  # pandas NaN -> None
    return {
        "id": int(run["id"]),
        "name": run["name"],
        "status": run["status"],
        "exit_code": None if run["exit_code"] is None else int(run["exit_code"]),
        "steps": int(run["steps"]),
        "started_at": run["started_at"],
        "ended_at": run["ended_at"],
        "duration_s": run_duration(run),
        "command": run["command"],
        "error": run["error"],
        "stop_reason": run["stop_reason"],
        "step_time_median_s": figures["step_time_median_s"],
    }


def run_duration(run: dict[str, Any]) -> float | None:
    """Seconds from start to end; so far, for a job still running."""
    start = run.get("started_at")
    if start is None:
        return None
    end = run.get("ended_at")
    if end is None or missing(end):
        return time.time() - start if run.get("status") == "running" else None
    return float(end - start)


def cmd_runs(as_json: bool, limit: int | None = None, every: bool = False) -> int:
    """The runs, newest first: every one as JSON, the newest ``TABLE_ROWS`` in the table
    (10,000 rows took rich 10 s to draw; nobody reads them on a terminal), unless
    ``limit`` or ``every`` says otherwise."""
    if limit is not None and limit < 1:
        print(f"stepscope: --limit must be at least 1, not {limit}", file=sys.stderr)
        return 2
    if limit is None and not (as_json or every):
        limit = TABLE_ROWS
    with RunStore() as store:
        if every or limit is None:
            runs = store.run_rows()
            total = len(runs)
        else:  # a table's newest rows, and the count it says they are of
            runs = store.run_rows(limit=limit)
            total = store.run_count()
        top = store.top_findings([int(run["id"]) for run in runs])
        figures, todo = kept_figures(store, run_states(runs))
        ended = sum(state.ended for state in todo)
        if ended >= SAY_COMPUTING_FROM:
            print(
                f"stepscope: computing the figures of {ended} runs once (kept in the store:"
                " later lists read them)",
                file=sys.stderr,
            )
        figures.update(compute_figures(store, todo))
        rows = []
        for rec in runs:
            row = run_row(rec, figures[int(rec["id"])])
            finding = top.get(int(rec["id"]))
            row["top_finding"] = (
                None
                if finding is None
                else {k: finding.to_json()[k] for k in ("class", "subtype", "title", "share")}
            )
            rows.append((row, finding))
    if as_json:
        print_json([row for row, _ in rows])
        return 0
    if not rows:
        term.console().print(
            f"no runs yet in {esc(store.where)}: try stepscope run -- python train.py"
        )
        return 0
    table = term.table(title=f"runs in {esc(store.where)}", title_justify="left")
    with_findings = any(finding is not None for _, finding in rows)
    for col, justify in (
        ("id", "right"),
        ("name", "left"),
        ("status", "left"),
        ("exit", "right"),
        ("steps", "right"),
        ("median step", "right"),
        ("started", "left"),
        ("duration", "right"),
        *((("top finding", "left"),) if with_findings else ()),
    ):
        table.add_column(
            col,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=col in ("started", "status", "name"),
            overflow="fold" if col == "top finding" else "ellipsis",
        )
    for r, finding in rows:
        table.add_row(
            str(r["id"]),
            esc(r["name"]),
            status_text(r["status"]),
            "" if r["exit_code"] is None else str(r["exit_code"]),
            str(r["steps"]),
            fmt_s(r["step_time_median_s"]),
            fmt_time(r["started_at"], short=True),
            fmt_s(r["duration_s"], digits=1),
            *((finding_text(finding),) if with_findings else ()),
        )
    term.console().print(table)
    if len(rows) < total:
        term.say(
            term.console(),
            f"the newest {len(rows):,} of {total:,} runs: --all lists every one,"
            " --limit N the newest N",
        )
    return 0


def cmd_capture(ref: str, steps: int) -> int:
    # local: what `capture` needs of a running job, which `runs` never does
    from stepscope.app.ownership import refusal
    from stepscope.collectors.capture.control import request_capture  # local: same

    with RunStore() as store:
        run_id = store.resolve_run(ref)
        run = store.run(run_id)
        refused = refusal(run)
        if refused is not None:  # its folder and job may be another user's, elsewhere
            print(f"stepscope: cannot capture run {run_id}: {refused}", file=sys.stderr)
            return EXIT_REFUSED
        if run["status"] != "running":
            print(
                f"stepscope: run {run_id} is not running (status: {run['status']}); "
                "a capture can only be requested from a running job",
                file=sys.stderr,
            )
            return 1
        if steps < 1:
            print(f"stepscope: --steps must be at least 1, not {steps}", file=sys.stderr)
            return 2
        run_dir = store.run_dir(run_id)
        request_id = request_capture(run_dir, steps)
    print(
        f"stepscope: asked run {run_id} to profile its next {steps} step(s) "
        f"(request {request_id[:8]}); each rank starts at its next step boundary and the "
        f"trace lands in {run_dir} — see it with: stepscope show {run_id}"
    )
    return 0
