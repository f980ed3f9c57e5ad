"""One line per experiment arm: where its fixes changed the step, against the baseline.

A speed-up says how much an arm gained, not where. A user who sees "1.38x" for
``dataloader_workers`` should also see that the data wait is what shrank, so that a fix
is seen to act where it was predicted to, and a gain that came from somewhere else
(or a loss) is noticed. The line reads the operator/phase diff
(``analyzers.report.run_diff_ops.diff_runs``) of one pair of trials: the baseline arm's
first trial that ran its steps and the arm's. One pair, not every trial: a diff loads
both runs' traces, and the arm's speed-up already pools its trials; the diff's own
intervals say whether each change stands out of that pair's noise.

Phases and operators/kernels are named; the trace's breakdown categories are not,
since they say the same as the phases in other words ("DataLoader" next to "data
wait"). Explaining is a courtesy beside the measured result, so it never raises: what
stops it (a trial missing, a trace unreadable) becomes "changes unknown: <why>".
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from stepscope.analyzers.report.op_diff import GONE, NEW, SAME
from stepscope.analyzers.report.run_diff_ops import diff_runs
from stepscope.analyzers.trace.load import TraceError
from stepscope.errors import one_line_error
from stepscope.optim_runner.trials.failures import trial_error
from stepscope.optim_runner.verdict.verdict import NOT_RUN
from stepscope.store import RunNotFound, StoreError

NOTHING = "no measurable change in any operator or phase"
UNKNOWN = "changes unknown"
#: the rows a line may name: the trace's categories repeat the phases in other words
NAMED_KINDS = ("phase", "operator", "kernel")
#: phase names as a line says them: the step timer's "other" is the rest of the step
_PHASE_WORDS = {"other": "rest of the step"}
#: between a line's changes
SEPARATOR = "; "
#: a kernel's templated name can run to hundreds of characters; the line stays one line
MAX_NAME = 60
#: errors about the data (a missing run, an unreadable trace, the store), said as they are
_DATA_ERRORS = (RunNotFound, StoreError, TraceError, OSError, MemoryError)

log = logging.getLogger(__name__)


def _name(row: pd.Series) -> str:
    name = str(row["name"])
    if row["kind"] == "phase":
        name = _PHASE_WORDS.get(name, name)
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 1] + "…"


def _phrase(row: pd.Series) -> str:
    """'data wait -84 %', 'new aten::_fused_adamw_', 'aten::copy_ gone'."""
    name = _name(row)
    if row["status"] == NEW:
        return f"new {name}"
    if row["status"] == GONE:
        return f"{name} gone"
    a_ns, b_ns = float(row["a_ns"]), float(row["b_ns"])
    if a_ns > 0 and b_ns > 0:
        return f"{name} {100 * (b_ns - a_ns) / a_ns:+.0f} %"
    return f"{name} {row['status']}"  # calls of no measured time on one side


def changes_line(ops: pd.DataFrame, categories: pd.DataFrame, limit: int = 3) -> str:
    """The ``limit`` biggest measurable changes of a diff's rows, in words."""
    rows = pd.concat([categories, ops], ignore_index=True)
    rows = rows[rows["kind"].isin(NAMED_KINDS) & (rows["status"] != SAME)]
    if rows.empty:
        return NOTHING
    order = rows["diff_ns"].abs().sort_values(ascending=False, kind="stable").index
    # "; ": an operator's shapes carry commas of their own ("aten::mm (256x256, 256x256)")
    return SEPARATOR.join(_phrase(rows.loc[i]) for i in order[:limit])


def unknown(why: str) -> str:
    return f"{UNKNOWN}: {why}"


def _why(exc: BaseException) -> str:
    """A data error's own first line ("no run with id 9"); anything else with its type."""
    if isinstance(exc, _DATA_ERRORS) and str(exc).strip():
        return str(exc).strip().splitlines()[0][:300]
    return one_line_error(type(exc), exc)


def explain_arm(store: Any, baseline_run_id: int, arm_run_id: int, limit: int = 3) -> str:
    """What run ``arm_run_id`` changed most against ``baseline_run_id``, as one line."""
    try:
        diff = diff_runs(store, int(baseline_run_id), int(arm_run_id))
        named = [f for f in (diff.ops, diff.categories) if f["kind"].isin(NAMED_KINDS).any()]
        if not named:  # nothing was compared: not the same as nothing changed
            return unknown(diff.warnings[-1] if diff.warnings else "no operator or phase timed")
        return changes_line(diff.ops, diff.categories, limit)
    except _DATA_ERRORS as exc:
        return unknown(_why(exc))
    except Exception as exc:  # a bug: logged, but the optimize table still renders
        log.warning(
            "explaining run %s against %s failed", arm_run_id, baseline_run_id, exc_info=True
        )
        return unknown(_why(exc))


def _first_done(store: Any, runs: list[int] | None) -> int | None:
    """The first of ``runs`` that ran its steps (``failures.trial_error``); None if none."""
    for run_id in runs or []:
        try:
            if trial_error(store, store.run(int(run_id))) is None:
                return int(run_id)
        except _DATA_ERRORS:
            continue
    return None


def explain_result(store: Any, result: dict[str, Any], limit: int = 3) -> dict[str, str]:
    """One line per candidate arm of an experiment's ``result`` (``run_experiment``'s),
    by arm name: its first completed trial against the baseline arm's (the confirmation
    arm against the baseline trials run beside it)."""
    base = result.get("baseline") or {}
    out: dict[str, str] = {}
    for c in result.get("candidates") or []:
        name = str(c.get("name"))
        if c.get("status") == "not_applied":
            out[name] = unknown("its fixes did not take effect")
            continue
        if c.get("status") == NOT_RUN:
            out[name] = unknown("not run")
            continue
        base_runs = base.get("confirm_runs") if name == "confirm" else base.get("runs")
        ref, run = _first_done(store, base_runs), _first_done(store, c.get("runs"))
        if ref is None:
            out[name] = unknown("no baseline trial ran its steps")
        elif run is None:
            out[name] = unknown("no trial of this arm ran its steps")
        else:
            out[name] = explain_arm(store, ref, run, limit)
    return out


__all__ = ["NOTHING", "SEPARATOR", "UNKNOWN", "changes_line", "explain_arm", "explain_result"]
