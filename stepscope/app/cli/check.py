"""`stepscope check RUN --against BASELINE`: a pass/fail answer a CI job can gate on.

The decision is ``optim_runner/check/perf_check.py``'s (the API returns the same
``CheckResult``); this module only says it: for a terminal (rich), as Markdown a CI job
posts as its summary (``$GITHUB_STEP_SUMMARY``), as JSON, and as a JUnit XML report
(``--junit``), which CI systems show beside the test suite's own. Exit codes are the
contract a pipeline reads: 0 not measurably slower, 1 slower (or an unknown run or tag,
as for every command that takes a run: ``exit_codes.py``), 2 cannot tell (runs without
timed steps, a bad option), each failure with one line; an inconclusive check (time it
could not judge without run-to-run spread) exits 0 with a warning line on stderr, or 3
with ``--inconclusive fail``.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from stepscope.app.cli import term
from stepscope.app.cli.exit_codes import EXIT_UNKNOWN_RUN
from stepscope.app.cli.term import esc, print_json, say
from stepscope.app.formats import fmt_ci, fmt_num, fmt_ratio, fmt_s, fmt_signed_s, missing
from stepscope.optim_runner.check.over_runs import parse_runs
from stepscope.optim_runner.check.perf_check import (
    CANNOT_COMPARE,
    FASTER,
    INCONCLUSIVE,
    SLOWER,
    CheckResult,
    Figure,
    check_runs,
    parse_slowdown,
)
from stepscope.store import RunNotFound, RunStore, StoreError

FORMATS = ("text", "markdown", "json")
SUITE = "stepscope check"

_PHRASE = {
    SLOWER: "is slower than",
    FASTER: "is faster than",
    CANNOT_COMPARE: "cannot be compared with",
    INCONCLUSIVE: "cannot be judged yet against",
}


def cmd_check(
    run: str,
    against: str,
    max_slowdown: str = "5%",
    fmt: str = "text",
    junit: str | None = None,
    operators: bool = True,
    runs: int | str = "auto",
    inconclusive: str = "pass",
) -> int:
    option = "--max-slowdown"
    try:  # before the store is opened: a typo is told at once
        allowed = parse_slowdown(max_slowdown)  # parsed here only: check_runs takes the fraction
        option = "--runs"
        parse_runs(runs)
    except ValueError as exc:
        print(f"stepscope check: {option}: {exc}", file=sys.stderr)
        return 2
    try:
        with RunStore() as store:
            result = check_runs(
                store, run, against, allowed, operators, runs, inconclusive=inconclusive
            )
    except RunNotFound as exc:  # as for every command that takes a run
        print(f"stepscope check: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN_RUN
    except (StoreError, ValueError) as exc:
        print(f"stepscope check: {exc}", file=sys.stderr)
        return 2
    if junit is not None:
        try:
            write_junit(result, Path(junit))
        except OSError as exc:
            print(f"stepscope check: --junit {junit}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    line = f"stepscope check: {subject(result)}: {result.why}"
    if fmt == "json":
        print_json(result.to_json())
    elif fmt == "markdown":
        sys.stdout.write(markdown(result))
    elif result.verdict != CANNOT_COMPARE:
        print_text(result)
    # the verdict in one line on stderr wherever stdout is not it: a CI log shows it while
    # the summary goes to its file, and "cannot compare" is one line, as other errors are
    if fmt != "text" or result.verdict == CANNOT_COMPARE:
        print(line, file=sys.stderr)
    if result.verdict == INCONCLUSIVE:  # a pass that must not look like one in a CI log
        how = "failing (--inconclusive fail)" if result.inconclusive_fails else "passing"
        print(f"stepscope check: warning: inconclusive, {how}: {result.why}", file=sys.stderr)
    return result.exit_code


# -- words shared by every form ------------------------------------------------------------
def subject(result: CheckResult, quote: str = "'") -> str:
    """'run 15 'train' is slower than run 12 'train' (tag main-baseline)'."""

    def named(run_id: int, name: str) -> str:
        return f"run {run_id} {quote}{name}{quote}"

    tag = f" (tag {quote}{result.baseline_tag}{quote})" if result.baseline_tag else ""
    phrase = _PHRASE.get(result.verdict, "is not measurably slower than")
    return (
        f"{named(result.run_id, result.run_name)} {phrase} "
        f"{named(result.baseline_id, result.baseline_name)}{tag}"
    )


def value_text(figure: Figure, value: float | None) -> str:
    if value is None or missing(value):
        return "-"
    return fmt_s(value) if figure.unit == "s" else f"{fmt_num(value)} {figure.unit}"


def interval_text(figure: Figure) -> str:
    return fmt_ci((figure.ci.lo, figure.ci.hi))


def time_change_text(figure: Figure) -> str:
    """The run's extra time per unit of work, with its interval: '+12.0 % (+8.1 to +16.2 %)'."""
    estimate, least, most = figure.slowdown
    return f"{estimate * 100:+.1f} % ({least * 100:+.1f} to {most * 100:+.1f} %)"


def figure_rows(result: CheckResult) -> list[list[str]]:
    return [
        [
            f.name,
            value_text(f, f.baseline),
            value_text(f, f.run),
            fmt_ratio(f.ci.ratio),
            interval_text(f),
            time_change_text(f),
            f.verdict,
        ]
        for f in result.figures
    ]


FIGURE_HEADER = ["figure", "baseline", "run", "speed", "95 % CI", "time change", "verdict"]
OPERATOR_HEADER = ["what", "kind", "baseline/step", "run/step", "change (95 % CI)", "status"]


def operator_rows(result: CheckResult) -> list[list[str]]:
    """The regressed operators' rows: per-step times and the change with its interval."""
    ops = result.operators
    if ops is None:
        return []

    def ns(x: Any) -> str:
        return "-" if missing(x) else fmt_s(float(x) / 1e9)

    def signed(x: float) -> str:
        return fmt_signed_s(float(x) / 1e9)

    def change(row: dict[str, Any]) -> str:
        if missing(row.get("diff_ns")):
            return "-"
        text = signed(row["diff_ns"])
        if not missing(row.get("lo_ns")) and not missing(row.get("hi_ns")):
            text += f" ({signed(row['lo_ns'])} to {signed(row['hi_ns'])})"
        return text

    return [
        [str(r["name"]), str(r["kind"]), ns(r["a_ns"]), ns(r["b_ns"]), change(r), str(r["status"])]
        for r in ops.to_dict("records")
    ]


def limit_text(result: CheckResult) -> str:
    return (
        f"allowed slowdown {result.max_slowdown * 100:g} %: a figure fails only when its whole "
        "95 % interval is beyond it (speed: the baseline's time over the run's, > 1: faster)"
    )


# -- the terminal ----------------------------------------------------------------------------
def print_text(result: CheckResult) -> None:
    con = term.console()
    mark = "[green]✓[/green]" if result.passed else "[red]✗[/red]"
    if result.verdict == INCONCLUSIVE:
        mark = "[yellow]?[/yellow]" if result.passed else "[red]?[/red]"
    con.print(f"{mark} {esc(subject(result))}", highlight=False)
    say(con, f"  {result.why}")
    if result.figures:
        table = term.table()
        for col in FIGURE_HEADER:
            table.add_column(col, justify="left" if col in ("figure", "verdict") else "right")
        for row in figure_rows(result):
            table.add_row(*(esc(c) for c in row))
        con.print(table)
        say(con, limit_text(result))
    ops = operator_rows(result)
    if ops:
        table = term.table(
            title=f"what regressed in run {result.run_id} against run {result.baseline_id} "
            "(largest change first)",
            title_justify="left",
        )
        for col in OPERATOR_HEADER:
            table.add_column(col, justify="left" if col in ("what", "kind", "status") else "right")
        for row in ops:
            table.add_row(*(esc(c) for c in row))
        con.print(table)
    elif result.operators is not None and result.figures:
        say(con, "nothing measured slower or new in the run, operator by operator")
    for note in result.notes:
        say(con, f"note: {note}")


# -- Markdown (a CI job's summary) -------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    left = ("kind", "status", "verdict")
    align = ["---" if i == 0 or h in left else "---:" for i, h in enumerate(header)]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def markdown(result: CheckResult) -> str:
    """GitHub-flavoured Markdown: a header with ✅/❌ (the step's outcome), the figures
    with their intervals, the operators that regressed, the notes."""
    mark = "✅" if result.passed else "❌"
    if result.verdict == INCONCLUSIVE:
        mark = "⚠️" if result.passed else "❌"
    lines = [
        f"### {mark} stepscope check: {_cell(subject(result, quote='`'))}",
        "",
        _cell(result.why),
        "",
    ]
    if result.figures:
        lines += [*_md_table(FIGURE_HEADER, figure_rows(result)), ""]
        lines += [f"<sub>{limit_text(result)}</sub>", ""]
    ops = operator_rows(result)
    if ops:
        lines += ["#### What regressed (largest change first)", ""]
        ops = [[f"`{row[0].replace('`', '')}`", *row[1:]] for row in ops]
        lines += [*_md_table(OPERATOR_HEADER, ops), ""]
    lines += [f"> note: {_cell(note)}" for note in result.notes]
    return "\n".join(lines).rstrip("\n") + "\n\n"


# -- JUnit XML -----------------------------------------------------------------------------
def junit_tree(result: CheckResult) -> ET.ElementTree:
    """One testsuite, one testcase per figure checked (a <failure> for a slower one);
    a check that could not compare is one testcase with an <error>."""
    root = ET.Element("testsuites", name="stepscope")
    suite = ET.SubElement(root, "testsuite", name=SUITE)
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("run", result.run_id),
        ("baseline", result.baseline_id),
        ("baseline_tag", result.baseline_tag or ""),
        ("max_slowdown", result.max_slowdown),
    ):
        ET.SubElement(props, "property", name=key, value=str(value))
    failures = errors = skipped = 0
    if result.verdict == CANNOT_COMPARE:
        case = ET.SubElement(suite, "testcase", classname=SUITE, name="compare")
        ET.SubElement(case, "error", message=result.why, type=CANNOT_COMPARE).text = result.why
        errors = 1
    for figure in result.figures:
        case = ET.SubElement(suite, "testcase", classname=SUITE, name=figure.name)
        text = (
            f"{figure.name}: baseline {value_text(figure, figure.baseline)}, run "
            f"{value_text(figure, figure.run)}; speed {fmt_ratio(figure.ci.ratio)} "
            f"(95 % CI {interval_text(figure)}); time change {time_change_text(figure)}; "
            f"allowed slowdown {result.max_slowdown * 100:g} %"
        )
        if figure.verdict == SLOWER or (figure.verdict == INCONCLUSIVE and not result.passed):
            failures += 1
            ET.SubElement(case, "failure", message=text, type=figure.verdict).text = result.why
        elif figure.verdict == INCONCLUSIVE:
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{INCONCLUSIVE}: {text}").text = result.why
        else:
            ET.SubElement(case, "system-out").text = f"{figure.verdict}: {text}"
    tests = max(len(result.figures), 1 if errors else 0)
    for node in (root, suite):
        node.set("tests", str(tests))
        node.set("failures", str(failures))
        node.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    if result.notes:
        ET.SubElement(suite, "system-out").text = "\n".join(result.notes)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(result: CheckResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_tree(result).write(path, encoding="utf-8", xml_declaration=True)


__all__ = ["FORMATS", "cmd_check", "junit_tree", "markdown", "write_junit"]
