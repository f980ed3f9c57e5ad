"""Which runs a check judges over, and which interval each of its figures gets.

A time-based verdict may only come from an interval that contains run-to-run spread
(issue 36: two runs of one unchanged job measured 16.7 % apart, each ±1 % over its own
steps). So, for each figure:

1. **Over runs** (``over_runs.py``) where the check has them: by default ("auto") when
   each side has at least ``MIN_RUNS_EACH`` finished runs of its name (the newest
   ``AUTO_RUNS``); with ``--runs N`` (N >= 2) whenever the two sides have three runs in
   all, as before.
2. Else **one run against one, widened** by the host's run-to-run spread
   (``host_spread.py``: the history of the sides' names, else ``calibrate --noise``).
   Runs of a name that were not judged over still count as its history.
3. Else **steps only**: the per-step interval, which can say "not slower" (a wider
   interval around the same estimate would say so too) but never "slower" or "faster":
   a "slower" there becomes ``INCONCLUSIVE`` (``figure_verdict``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stepscope.optim_runner.check.check_result import (
    FASTER,
    INCONCLUSIVE,
    NO_SLOWDOWN,
    OVER_RUNS,
    SLOWER,
    STEPS_ONLY,
    WIDENED,
    Figure,
)
from stepscope.optim_runner.check.host_spread import host_spread, widened
from stepscope.optim_runner.check.over_runs import (
    AUTO_RUNS,
    MIN_RUNS_EACH,
    interval_over_runs,
    judged_steps,
    replicate_ids,
    run_value,
)
from stepscope.optim_runner.speedup.stats import SpeedupCI


def pick_runs(
    store: Any, base_id: int, run_id: int, asked: int | None
) -> tuple[list[int], list[int], bool, list[str]]:
    """Each side's runs (the named one first), whether to judge over them, and notes.
    ``asked``: ``--runs N``, None for auto."""
    cap = AUTO_RUNS if asked is None else asked
    base_ids = replicate_ids(store, base_id, cap)
    run_ids = replicate_ids(store, run_id, cap, exclude=base_ids)
    notes = []
    if asked is None:
        over = min(len(base_ids), len(run_ids)) >= MIN_RUNS_EACH
    else:
        over = asked > 1 and len(base_ids) + len(run_ids) >= 3
        if asked > 1 and min(len(base_ids), len(run_ids)) < asked:
            base, run = store.run(base_id)["name"], store.run(run_id)["name"]
            notes.append(
                f"asked for {asked} runs of each side: found {len(base_ids)} named {base!r} "
                f"up to run {base_id} and {len(run_ids)} named {run!r} up to run {run_id}"
            )
    if not over:
        return [base_id], [run_id], False, notes
    notes.append(
        f"judged over {len(base_ids)} baseline run(s) ({_ids(base_ids)}) and "
        f"{len(run_ids)} run(s) ({_ids(run_ids)}): intervals that cover run-to-run spread"
    )
    return base_ids, run_ids, True, notes


def with_intervals(
    store: Any, figures: list[Figure], base_ids: list[int], run_ids: list[int], over: bool
) -> tuple[list[Figure], list[str]]:
    """Each figure with the interval of the module docstring (its ``basis``), and notes."""
    base_row, run_row = store.run(base_ids[0]), store.run(run_ids[0])
    notes = []
    if base_row["host"] != run_row["host"]:
        notes.append(
            f"the runs ran on different hosts ({base_row['host']}, {run_row['host']}): the "
            "check compares the machines as well as the code"
        )
    if over:
        base_steps = [judged_steps(store, i) for i in base_ids]
        run_steps = [judged_steps(store, i) for i in run_ids]
    out, unknown = [], []
    for f in figures:
        if over:
            base = [v for v in (run_value(f.name, st) for st in base_steps) if v is not None]
            run = [v for v in (run_value(f.name, st) for st in run_steps) if v is not None]
            ci = interval_over_runs(base, run)
            if ci is not None:
                out.append(replace(f, ci=ci, basis=OVER_RUNS))
                continue
        got = _widened(store, f, base_row, run_row)
        if got is None:
            unknown.append(f.name)
        out.append(got or replace(f, basis=STEPS_ONLY))
    if unknown:
        notes.append(
            f"no run-to-run spread known for {', '.join(unknown)}: one run of "
            f"{base_row['name']!r} against one of {run_row['name']!r}, no earlier runs of "
            "those names on their host, and no `stepscope calibrate --noise` for it; record "
            f"{MIN_RUNS_EACH} runs of each side, or calibrate the host"
        )
    return out, notes


def _widened(store: Any, figure: Figure, base: dict, run: dict) -> Figure | None:
    names = [str(base["name"]), str(run["name"])]
    up_to = max(int(base["id"]), int(run["id"]))
    spreads = []
    for row in (base, run):
        spread = host_spread(store, figure.name, names, str(row["host"]), up_to)
        if spread is None:
            return None
        spreads.append(spread)
    ci = widened(figure.ci, spreads[0], spreads[1])
    return replace(figure, ci=ci, basis=WIDENED, spread=(spreads[0], spreads[1]))


def figure_verdict(ci: SpeedupCI, max_slowdown: float, basis: str = OVER_RUNS) -> str:
    """Slower when even the interval's optimistic end is beyond the allowed slowdown;
    faster when its pessimistic end is above 1. On a ``STEPS_ONLY`` interval "slower" is
    ``INCONCLUSIVE`` and "faster" only "not slower": that interval is too narrow for
    either, while a wider one around the same estimate would still say "not slower"."""
    if ci.hi < 1.0 / (1.0 + max_slowdown):
        return INCONCLUSIVE if basis == STEPS_ONLY else SLOWER
    if ci.lo > 1.0 and basis != STEPS_ONLY:
        return FASTER
    return NO_SLOWDOWN


def basis_words(figures: tuple[Figure, ...]) -> str:
    """How the figures' intervals were made, once for all that share it."""
    return "; ".join(dict.fromkeys(f.basis_text() for f in figures))


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


__all__ = ["basis_words", "figure_verdict", "pick_runs", "with_intervals"]
