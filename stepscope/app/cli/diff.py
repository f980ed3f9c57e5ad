"""`stepscope diff A B [--json] [--top N] [--kind operator|kernel|...]`: where the time went.

A and B are runs of the store (id, name, ``last``) or trace files/folders. The table is
B against A, measured changes first (biggest first), each with its 95 % interval and a status; the
category/phase table under it says which part of the step moved. Bad input is one line
and exit 2 (``check`` keeps 1 for "slower").
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pandas as pd

from stepscope.analyzers.report.op_diff import GONE, NEW, SLOWER
from stepscope.analyzers.report.run_diff_ops import RunDiff, diff_runs, diff_traces
from stepscope.analyzers.trace.load import TraceError
from stepscope.app.cli import term
from stepscope.app.cli.exit_codes import EXIT_UNKNOWN_RUN
from stepscope.app.cli.term import esc
from stepscope.app.formats import fmt_s, fmt_signed_s
from stepscope.store import RunNotFound, RunStore, StoreError

_STYLE = {SLOWER: "red", NEW: "red", "faster": "green", GONE: "green"}


def _is_path(ref: str) -> bool:
    return Path(ref).expanduser().exists()


def _ns(value: float) -> str:
    return "" if pd.isna(value) else fmt_s(float(value) / 1e9)


def _signed(value: float) -> str:
    return "" if pd.isna(value) else fmt_signed_s(float(value) / 1e9)


def _interval(row: pd.Series) -> str:
    if pd.isna(row["lo_ns"]):
        return ""
    return f"{_signed(row['lo_ns'])} … {_signed(row['hi_ns'])}"


def _change(row: pd.Series) -> str:
    if row["a_ns"] > 0 and row["b_ns"] > 0:
        return f"{100 * row['diff_ns'] / row['a_ns']:+.0f} %"
    return ""


def _table(df: pd.DataFrame, title: str, top: int) -> term.Table:
    table = term.table(title)
    for col in ("kind", "name", "A / step", "B / step", "change", "95 % interval"):
        table.add_column(col, overflow="fold", max_width=70 if col == "name" else None)
    table.add_column("calls A → B", justify="right")
    table.add_column("status")
    for _, row in df.head(top).iterrows():
        style = _STYLE.get(row["status"], "")
        calls = (
            ""
            if row["kind"] in ("category", "phase")
            else (f"{row['a_calls']:.1f} → {row['b_calls']:.1f}")
        )
        table.add_row(
            esc(row["kind"]),
            esc(row["name"]),
            _ns(row["a_ns"]),
            _ns(row["b_ns"]),
            _signed(row["diff_ns"]) + (f" ({_change(row)})" if _change(row) else ""),
            _interval(row),
            calls,
            f"[{style}]{esc(row['status'])}[/]" if style else esc(row["status"]),
        )
    return table


def print_diff(diff: RunDiff, top: int = 15, kind: str | None = None) -> None:
    con = term.console()
    ops = diff.ops if kind is None else diff.ops[diff.ops["kind"] == kind]
    head = f"{diff.b} against {diff.a}: mean step {_ns(diff.step_ns_a)} → {_ns(diff.step_ns_b)}"
    term.say(con, head)
    for warning in diff.warnings:
        term.say(con, f"warning: {warning}")
    if len(ops):
        shown = min(top, len(ops))
        con.print(
            _table(
                ops,
                f"operators and kernels, measured changes first, biggest first ({shown} of {len(ops)})",
                top,
            )
        )
    if len(diff.categories):
        con.print(_table(diff.categories, "step-time categories and phases", len(diff.categories)))


def _resolve(store: RunStore, ref: str) -> int:
    return store.resolve_run(ref)


def cmd_diff(a: str, b: str, as_json: bool = False, top: int = 15, kind: str | None = None) -> int:
    try:
        if _is_path(a) and _is_path(b):
            diff = diff_traces(Path(a).expanduser(), Path(b).expanduser())
        else:
            with RunStore() as store:
                diff = diff_runs(store, _resolve(store, a), _resolve(store, b))
    except RunNotFound as exc:  # as for every command that takes a run
        print(f"stepscope: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_RUN
    except (StoreError, TraceError) as exc:
        print(f"stepscope: {exc}", file=sys.stderr)
        return 2
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(diff.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print_diff(diff, top=top, kind=kind)
    return 0
