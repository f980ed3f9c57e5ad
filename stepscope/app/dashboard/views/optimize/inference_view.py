"""The Optimize page's parts for inference runs: the output guard's limits, the control
that starts a batch-size sweep, and a finished sweep's table and curve.

Every figure shown is the stored result's (``stepscope optimize --sweep batch --json``),
so the page and the CLI never disagree. The sweep runs in a process of its own
(``optim_runner.background``) and is followed like an experiment, through the store.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.latency import is_inference
from stepscope.app.dashboard import data
from stepscope.app.dashboard.charts.sweep import peak_curve, sweep_curve
from stepscope.app.dashboard.ui import no_links
from stepscope.app.dashboard.views.optimize.largest_batch_view import answer_view
from stepscope.app.dashboard.views.optimize.option_inputs import option_input
from stepscope.app.dashboard.views.optimize.sweep_button import sweep_button
from stepscope.app.formats import fmt_s
from stepscope.optim_runner.experiment.experiment import DEFAULT_TRIALS
from stepscope.optim_runner.sweeps.sweep import DEFAULT_FACTORS, SWEEP_KIND, parse_factors
from stepscope.optim_runner.verdict.fits import size_text

SWEEP_STEPS = 20  # a sweep's default steps per trial: per batch size, the tail needs steps


def is_sweep(row: dict[str, Any]) -> bool:
    return (row.get("config") or {}).get("kind") == SWEEP_KIND


def inference_run(run: dict[str, Any], steps: pd.DataFrame) -> bool:
    """Forward steps only, no optimizer: guarded by its outputs, and a sweep is offered."""
    return not (run.get("facts") or {}).get("optimizer") and is_inference(steps)


# -- the output guard's limits -----------------------------------------------------------------
def guard_limits(run: dict[str, Any], steps: pd.DataFrame) -> dict[str, float]:
    """For an inference run: the output guard's limits (``--output-tolerance``,
    ``--min-agreement``), for ``start_experiment``; nothing for a training run."""
    if not inference_run(run, steps):
        return {}
    st.caption(
        "An inference job has no loss: each candidate's outputs on the same seeded inputs "
        "are compared with the baseline's (top-1 agreement for classifiers, the largest "
        "difference otherwise); one outside these limits is not recommended."
    )
    c1, c2, _ = st.columns([1, 1, 2])
    agreement = option_input("min_agreement", "guard_agreement", c1)
    tolerance = option_input("output_tolerance", "guard_tolerance", c2)
    return {"min_agreement": float(agreement), "output_tolerance": float(tolerance)}


# -- starting one ----------------------------------------------------------------------------
def start_form(
    home: str, run: dict[str, Any], steps: pd.DataFrame, busy: dict[str, Any] | None
) -> None:
    """For an inference run: factors, trials and steps, and the button. Nothing for a
    training run (a larger batch changes what it learns: the fixes above offer it)."""
    if not inference_run(run, steps):
        return
    st.subheader("Batch-size sweep")
    st.caption(
        "Re-runs this inference job with its DataLoader's batch size multiplied by each "
        "factor, interleaved, and shows throughput and p99 latency per batch size: pick "
        "the knee. A larger batch does not change a per-sample inference output, so no "
        "consent is asked."
    )
    c1, c2, c3 = st.columns([2, 1, 1])
    text = c1.text_input(
        "batch-size factors", value=",".join(map(str, DEFAULT_FACTORS)), key="sweep_factors"
    )
    trials = c2.number_input(
        "trials per batch size", 1, 20, value=DEFAULT_TRIALS, key="sweep_trials"
    )
    n_steps = c3.number_input("steps per trial", 4, 100_000, value=SWEEP_STEPS, key="sweep_steps")
    try:
        factors = parse_factors(text)
    except ValueError as exc:
        st.warning(data.one_line(exc), icon=":material/warning:")
        return
    sweep_button(
        home,
        run,
        busy,
        label="Run the batch-size sweep",
        key="sweep",
        what=f"batch sizes x{', x'.join(map(str, factors))}",
        sizes=factors,
        steps=int(n_steps),
        trials=int(trials),
    )


# -- a finished sweep --------------------------------------------------------------------------
def result_view(row: dict[str, Any]) -> None:
    result = row.get("result") or {}
    rows = result.get("rows") or []
    if not rows:
        st.warning(f"Sweep {row['id']} ended without a result.", icon=":material/warning:")
        return
    answer_view(result)  # a training sweep's largest batch
    knee = result.get("knee")
    if knee:
        st.success(
            f"Knee: **batch {knee.get('batch_size')}** (x{knee['factor']}) — {no_links(knee['why'])}; "
            f"p99 {_ms(knee.get('p99_s'))} per batch.",
            icon=":material/check_circle:",
        )
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        st.warning(warning, icon=":material/warning:")
    st.dataframe(pd.DataFrame([_table_row(r, knee) for r in rows]), hide_index=True, key="sweep")
    fig = sweep_curve(rows, knee)
    if fig is not None:
        st.plotly_chart(fig, key="sweep_curve")
    for i, curve in enumerate(result.get("curves") or []):  # a memory fix's curve
        with st.expander(f"With {' + '.join(curve['fixes'])}: per batch size"):
            st.dataframe(
                pd.DataFrame([_table_row(r, None) for r in curve["rows"]]),
                hide_index=True,
                key=f"sweep_curve_{i}",
            )
    peaks = peak_curve(rows, result.get("largest_batch"), result.get("curves"))
    if peaks is not None:  # a training sweep
        st.plotly_chart(peaks, key="sweep_peaks")
    st.caption(
        f"{result['trials']} trials × {result['steps']} steps per batch size, interleaved; "
        "latency is each step's wall time (one batch, its data wait included), warm-up "
        f"left out; bootstrap 95 % intervals. {result.get('numerics') or ''}"
    )


def _table_row(r: dict[str, Any], knee: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "factor": "fit" if r.get("confirm") else f"x{r['factor']:g}",
        "batch size": r.get("batch_size"),
        "loader batch (read back)": r.get("applied"),
        "samples/s": r.get("samples_per_s"),
        "samples/s 95 % CI": _ci(r.get("samples_per_s_ci"), 1.0, ""),
        "p50 / batch": _ms(r.get("p50_s")),
        "p99 / batch": _ms(r.get("p99_s")),
        "p99 95 % CI": "—" if not r.get("p99_ci") else "–".join(map(fmt_s, r["p99_ci"])),
        **(
            {"peak memory": size_text(r["peak_bytes"]) if r.get("peak_bytes") else "—"}
            if "peak_key" in r
            else {}
        ),
        "status": r.get("status") if r.get("status") != "completed" else "ok",
        "knee": "◀ knee" if knee and r["factor"] == knee.get("factor") else "",
        "trial runs": ", ".join(f"#{x}" for x in r.get("runs") or []),
    }


def _ms(seconds: float | None) -> str:
    return fmt_s(seconds)


def _ci(ci: list[float] | None, scale: float, unit: str) -> str:
    return "—" if not ci else f"{ci[0] * scale:.4g}–{ci[1] * scale:.4g}{unit}"


__all__ = ["is_sweep", "result_view", "start_form"]
