"""The Optimize page once an experiment exists (``?run=ID&experiment=EID``).

While it runs, and when it failed: ``experiment_progress``. When it has
ended: the verdict first (which fixes to keep, the combined speed-up), then the
ablation behind it (with the operators and phases each arm changed most, from a diff
of its first trial against the baseline's), predicted against measured per fix, and
the way into the Compare view on one baseline trial and one trial of the best
candidate.

Every figure shown is the stored result's (``stepscope optimize --json``), so the page
and the CLI never disagree; only the inline before/after headline is computed here,
from the two trial runs it links to, the way the Compare page computes it, and each
arm's changes, the way the CLI's table computes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.app.applied import not_applied_text
from stepscope.app.dashboard import data, ui
from stepscope.app.dashboard.charts.compare import fix_speedups, step_time_distributions
from stepscope.app.dashboard.tables import unknown_in_words
from stepscope.app.dashboard.views.optimize.experiment_progress import first_line
from stepscope.app.dashboard.views.optimize.leave_one_out_view import leave_one_out
from stepscope.app.design_text import design_line, repeat_line, stopped_status, trials_phrase
from stepscope.app.formats import fmt_ci, fmt_num, fmt_ratio, fmt_s, guard_word, guarded, missing
from stepscope.optim_runner.speedup.speed import compare_speed
from stepscope.optim_runner.speedup.stats import timed_step_times
from stepscope.optim_runner.verdict.fits import fit_status, size_text
from stepscope.optim_runner.verdict.leave_one_out import in_set_text, loo_text
from stepscope.optim_runner.verdict.stacked import over_text
from stepscope.optim_runner.verdict.verdict import NOT_RUN

#: the ablation's column of what each arm changed (optim_runner/verdict/arm_changes.py)
CHANGES = "changed most vs baseline"


def header(row: dict[str, Any]) -> None:
    cfg = row.get("config") or {}
    st.subheader(f"Experiment {row['id']}")
    ui.status_badge(row["status"])
    started = datetime.fromtimestamp(row["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
    took = ""
    if row.get("ended_at"):
        took = f" · took {(row['ended_at'] - row['created_at']) / 60:.1f} min"
    keep = (row.get("result") or {}).get("keep_explicit", cfg.get("keep_explicit"))
    st.caption(
        f"started {started}{took} · fixes: {', '.join(cfg.get('fixes') or []) or '—'} · "
        f"{cfg.get('trials', '?')} trials × {cfg.get('steps', '?')} steps per arm"
        + (" · numerics may change" if cfg.get("allow_numerics") else "")
        + _explicit_note(keep)
    )


def _explicit_note(keep: bool | None) -> str:
    """How the trials treated the script's own values; nothing for an older experiment."""
    if keep is None:
        return ""
    if keep:
        return " · values the script set explicitly kept"
    return " · fixes override values the script set explicitly"


# -- the result ----------------------------------------------------------------------------------
def _quality(c: dict[str, Any]) -> str:
    if c.get("status") == "not_applied":
        return "—"
    if c.get("quality_ok") is None:
        return "—" if c["status"] in ("failed", NOT_RUN) else "not checked"
    return guard_word(c["quality_ok"])


def verdict(result: dict[str, Any]) -> None:
    """Which fixes to keep and what they gave together: the answer, before the evidence."""
    best, base = result["best"], result["baseline"]
    if best.get("goal") == "fit":  # the baseline ran out of memory: which arms fit
        show = st.success if best.get("fits") else st.warning
        show(best.get("answer"), icon=":material/memory:")
        return
    if best.get("goal") == "memory":  # --goal memory: the answer says peak and time
        show = st.success if best.get("fixes") else st.info
        show(f"Goal memory: {best.get('answer')}", icon=":material/memory:")
        return
    if best.get("fixes"):
        how = "confirmed in trials of its own" if best.get("confirmed") else "measured"
        over = over_text(best) or loo_text(best)
        how += f"; {over}" if over else ""
        st.success(
            f"Keep **{', '.join(best['fixes'])}**: {fmt_ratio(best['speedup'])} the throughput "
            f"(95 % CI {fmt_ci(best['ci'])}, {how}), with the {guarded(result)} kept.",
            icon=":material/check_circle:",
        )
    else:
        measured = [
            f"{c['name']} {fmt_ratio(c['speedup'])} (95 % CI {fmt_ci(c['ci'])}, {c['verdict']})"
            for c in result["candidates"]
            if c.get("speedup") is not None
        ]
        st.info(
            f"No fix measured faster with the {guarded(result)} kept: keep the job as it is."
            + (f" Measured: {'; '.join(measured)}." if measured else ""),
            icon=":material/info:",
        )
    for c in result["candidates"]:
        if c.get("status") == "not_applied":
            st.warning(
                f"**{c['name']}** was not measured: {not_applied_text(c)}.",
                icon=":material/block:",
            )
    warning = (result.get("contention") or {}).get("warning")
    if warning:
        st.warning(warning, icon=":material/warning:")
    cols = st.columns(4)
    cols[0].metric(
        "speed-up of the kept fixes",
        fmt_ratio(best.get("speedup")),
        delta=best.get("verdict"),
        delta_color="green" if best.get("verdict") == "faster" else "gray",
        delta_arrow="up" if best.get("verdict") == "faster" else "off",
        help="throughput (mean seconds per sample) against the baseline trials",
    )
    cols[1].metric("baseline samples/s", fmt_num(base.get("samples_per_s")))
    cols[2].metric("baseline median step", fmt_s(base.get("step_time_median_s")))
    warm = base.get("warmup") or {}
    cols[3].metric(
        "warm-up left out",
        f"{warm.get('steps', 0)} steps",
        help="per trial; " + (f"{warm['time_s']:.2f} s on average" if warm.get("time_s") else ""),
    )
    st.caption(
        f"{trials_phrase(result)} × {result['steps']} steps per arm, interleaved with the "
        "arm order rotated each trial, so machine drift hits every arm; ratios with "
        "bootstrap 95 % intervals, a quality guard on the losses."
    )
    for line in (design_line(result), repeat_line(result)):
        if line:
            st.caption(line)


def ablation_table(result: dict[str, Any], changes: Mapping[str, str] | None = None) -> None:
    """``changes``: each arm's line of what it changed most against the baseline
    (``arm_changes``), a column of its own: that a fix acted where it was predicted to."""
    st.markdown("**Ablation**: every candidate against the baseline trials")
    rows = []
    for c in result["candidates"]:
        step = c.get("step_time") or {}
        failed = c["status"] == "failed"
        skipped = c["status"] == "not_applied"
        if failed:
            status, why = c.get("failure") or "failed", first_line(c.get("error"))
        elif skipped:
            status, why = "not applied", not_applied_text(c)
        elif c.get("stopped"):
            # an arm stopped early may also have failed its guard: say both
            failed_guard = c.get("quality_ok") is False
            guard = first_line((c.get("quality") or {}).get("reason")) if failed_guard else ""
            status = stopped_status(c, result) or "stopped"
            why = "; ".join(x for x in (guard, c["stopped"]) if x)
        else:
            status, why = c["status"], first_line((c.get("quality") or {}).get("reason"))
        agreement = (c.get("agreement") or {}).get("text")  # why "disagree" (agreement.py)
        if agreement and not failed:
            why = "; ".join(x for x in (agreement, why) if x)
        rows.append(
            {
                "candidate": c["name"],
                "fixes": ", ".join(c["fixes"]),
                "status": status,
                "vs baseline": c.get("speedup"),  # each arm against the baseline, never another arm
                "95 % CI": fmt_ci(c.get("ci")),
                "verdict": not_applied_text(c) if skipped else c.get("verdict") or "—",
                "median step ratio": step.get("ratio"),
                # the guard's word: tokens, outputs or loss (optim_runner/guards/guard.py)
                guarded(result): _quality(c),
                "peak memory": c.get("trade") or "—",  # "peak 0.41x, 1.27x slower per sample"
                **({} if changes is None else {CHANGES: changes.get(c["name"], "—")}),
                "why": why,
                "trial runs": ", ".join(f"#{r}" for r in c.get("runs") or []),
                **_latency_columns(c.get("latency")),
            }
        )
    ratios = {c: fmt_ratio for c in ("vs baseline", "median step ratio")}
    ratios |= {f"{q} latency ratio": fmt_ratio for q in ("p50", "p99")}
    st.dataframe(
        unknown_in_words(pd.DataFrame(rows), ratios),  # an unmeasured arm: "—", not "None"
        hide_index=True,
        key="ablation",
        column_config={
            "vs baseline": st.column_config.NumberColumn(
                format="%.2fx",
                help="throughput against the baseline's: mean seconds per sample, "
                "baseline/candidate (the per-fix table says what each fix adds on top)",
            ),
            "median step ratio": st.column_config.NumberColumn(
                format="%.2fx",
                help="median step time, baseline/candidate; a candidate is faster only "
                "when this agrees with the throughput (else its verdict is 'disagree')",
            ),
            **{
                f"{q} latency ratio": st.column_config.NumberColumn(
                    format="%.2fx", help=f"inference: {q} latency, baseline/candidate"
                )
                for q in ("p50", "p99")
            },
            "peak memory": st.column_config.TextColumn(
                help="median peak memory of its trials against the baseline's (CUDA: max "
                "allocated; CPU: the process's peak RSS), beside its time",
            ),
            "why": st.column_config.TextColumn(width="large"),
            CHANGES: st.column_config.TextColumn(
                width="large",
                help="the operators and phases this arm changed most, its first trial "
                "against the baseline's first (95 % intervals over their steps or calls); "
                "Compare shows the whole diff",
            ),
        },
    )


def fit_table(result: dict[str, Any]) -> None:
    """Each candidate under the baseline's memory limit: fits or not, its peak, speed."""
    rows = [
        {
            "candidate": c["name"],
            "fixes": ", ".join(c["fixes"]),
            "status": fit_status(c),
            "peak memory": size_text(c["peak_bytes"]) if c.get("peak_bytes") else "—",
            "speed": c.get("speed") or "—",
            "why": first_line(c.get("error")) if c.get("status") != "not_applied" else "",
            "trial runs": ", ".join(f"#{r}" for r in c.get("runs") or []),
        }
        for c in result["candidates"]
    ]
    st.markdown("**Under the limit**: each candidate, run under the baseline's memory limit")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="fits")
    st.caption((result.get("out_of_memory") or {}).get("guard") or "")


def _latency_columns(lat: dict[str, Any] | None) -> dict[str, Any]:
    """An inference candidate's p50/p99 latency ratios (baseline/candidate) with intervals
    (``optim_runner/speedup/latency_compare.py``); no columns for a training experiment."""
    if not lat:
        return {}
    out: dict[str, Any] = {}
    for name in ("p50", "p99"):
        r = lat.get(name) or {}
        out[f"{name} latency ratio"] = r.get("ratio")
        out[f"{name} 95 % CI"] = fmt_ci(r.get("ci"))
    return out


def per_fix(result: dict[str, Any]) -> None:
    st.markdown("**Predicted vs measured**, per fix")
    in_set = any(f.get("in_set") for f in result["fixes"])
    rows = [
        {
            "fix": f["id"],
            "parameters": ", ".join(f"{k}={v}" for k, v in (f.get("params") or {}).items()),
            "bound (diagnosis)": f.get("predicted"),
            "bound (these trials)": f.get("predicted_in_experiment"),
            "measured": f.get("measured"),
            "95 % CI": fmt_ci(f.get("ci")),
            "verdict": _fix_verdict(f),
            "against": f.get("against"),
            **({"in the kept set": in_set_text(f)} if in_set else {}),
            "kept": "✓ keep" if f.get("kept") else "—",
        }
        for f in result["fixes"]
    ]
    x = st.column_config.NumberColumn
    bounds = {
        c: lambda v: fmt_ratio(v) if missing(v) else f"≤ {v:.2f}x"
        for c in ("bound (diagnosis)", "bound (these trials)")
    }
    st.dataframe(
        unknown_in_words(pd.DataFrame(rows), {**bounds, "measured": fmt_ratio}),
        hide_index=True,
        key="per_fix",
        column_config={
            "bound (diagnosis)": x(format="≤ %.2fx", help="Amdahl bound from the diagnosed run"),
            "bound (these trials)": x(
                format="≤ %.2fx", help="the bound again from the data wait of the baseline trials"
            ),
            "measured": x(format="%.2fx"),
        },
    )
    notes = [f"`{f['id']}`: {f['note']}" for f in result["fixes"] if f.get("note")]
    if notes:
        st.caption("Notes: " + " · ".join(notes))
    fig = fix_speedups(result["fixes"])
    if fig is not None:
        st.plotly_chart(fig, key="fix_speedups")
    why = [f"`{f['id']}`: {f['why_params']}" for f in result["fixes"] if f.get("why_params")]
    if why:
        st.caption("Parameters: " + " · ".join(why))


def _fix_verdict(f: dict[str, Any]) -> str:
    """The verdict; for a fix that never took effect, why (it was not measured)."""
    if f.get("verdict"):
        return str(f["verdict"])
    if f.get("status") == "not applied":
        return f"not applied: {f.get('not_applied_why') or 'no reason recorded'}"
    return str(f.get("status") or "—")


def pair_for_compare(home: str, result: dict[str, Any]) -> tuple[int, int, str] | None:
    """(baseline trial, candidate trial, candidate) to open in Compare; None if none ran.

    The candidate is the kept set's (else all fixes together, else any that completed);
    of its trials, the one whose ratio to the baseline trial of the same round is
    nearest the experiment's: the pair shows what the experiment measured, not an outlier.
    """
    done = [c for c in result["candidates"] if c["status"] == "completed" and c.get("runs")]
    if not done:
        return None
    by_name = {c["name"]: c for c in done}
    cand = by_name.get(result["best"].get("candidate") or "") or by_name.get("all") or done[0]
    base = result["baseline"]
    base_runs = base.get("confirm_runs") if cand["name"] == "confirm" else base.get("runs")
    pairs = list(zip(base_runs or [], cand["runs"], strict=False))
    if not pairs:
        return None
    target = math.log(cand["speedup"]) if cand.get("speedup") else 0.0

    def distance(pair: tuple[int, int]) -> float:
        head = compare_speed(
            data.finished_steps(home, pair[0]), data.finished_steps(home, pair[1])
        ).headline
        return abs(math.log(head.ratio) - target) if head is not None else math.inf

    a, b = min(pairs, key=distance)
    return int(a), int(b), cand["name"]


def before_after(home: str, result: dict[str, Any]) -> None:
    """The inline headline of one baseline/candidate pair, and the way into Compare."""
    st.subheader("Before and after")
    with ui.errors_as_one_line():
        pair = pair_for_compare(home, result)
    if pair is None:
        st.info("No candidate completed, so there is nothing to compare with the baseline.")
        return
    a, b, name = pair
    steps_a, steps_b = data.finished_steps(home, a), data.finished_steps(home, b)
    speed = compare_speed(steps_a, steps_b)
    cols = st.columns([1, 1, 2], vertical_alignment="center")
    if speed.headline is not None:
        ui.ratio_metric(
            cols[0],
            f"run #{b} vs #{a}",
            speed.headline,
            help=f"this pair of trials, on {speed.basis}; > 1 means the candidate is faster",
        )
    rate = [summarize_steps(steps)["samples_per_s"] for steps in (steps_a, steps_b)]
    cols[1].metric("samples/s", f"{fmt_num(rate[0])} → {fmt_num(rate[1])}")
    cols[2].page_link(
        "views/compare/page.py",
        label=f"Compare baseline trial #{a} with {name} trial #{b}",
        icon=":material/compare_arrows:",
        query_params={"a": str(a), "b": str(b)},
    )
    st.caption(
        f"One trial of each ({speed.headline.describe() if speed.headline else 'no ratio'}, "
        f"{speed.basis}): the pair nearest the experiment's figure. Compare shows their "
        "breakdowns, step times, losses, system timelines and settings side by side."
    )
    cand = next(c for c in result["candidates"] if c["name"] == name)
    base_runs = (
        result["baseline"].get("confirm_runs") if name == "confirm" else result["baseline"]["runs"]
    )
    pooled = {
        "baseline (all trials)": _pooled(home, base_runs or []),
        f"{name} (all trials)": _pooled(home, cand["runs"]),
    }
    st.markdown("**Step times of every trial**, baseline and candidate (timed steps)")
    st.plotly_chart(step_time_distributions(pooled), key="pooled_distributions")


def _pooled(home: str, runs: list[int]) -> np.ndarray:
    parts = [timed_step_times(data.finished_steps(home, r)) for r in runs]
    return np.concatenate(parts) if parts else np.zeros(0)


def result_view(home: str, row: dict[str, Any]) -> None:
    result = row.get("result") or {}
    if not result.get("candidates"):
        st.warning(f"Experiment {row['id']} ended without a result.", icon=":material/warning:")
        return
    verdict(result)
    if result.get("goal") == "fit":  # no baseline speed: absolute figures, no ratios
        fit_table(result)
        return
    try:
        changes = data.arm_changes(home, int(row["id"]), row.get("ended_at"), result)
    except data.user_errors() as exc:  # the store itself: the table is shown without them
        changes = None
        st.caption(f"What each arm changed is not shown: {data.one_line(exc)}")
    ablation_table(result, changes)
    per_fix(result)
    leave_one_out(result)
    before_after(home, result)
