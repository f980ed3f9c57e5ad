"""The notebook's view of one analysis: a ``Report`` whose parts are DataFrames.

``stepscope.analyze`` builds one; this module turns what the analyzers already compute
(the trace report, the diagnosis, the store's steps) into tidy DataFrames with fixed,
documented columns, so that a notebook can filter, group and plot them without knowing
the analyzers' own shapes. Nothing here analyses anything itself. Each part is built on
first use and kept, so a report costs the trace analysis and no more until a part is
asked for.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.analyzers.report.trace_report import TraceReport
from stepscope.analyzers.rules.diagnosis import Diagnosis, diagnose_report, diagnose_run
from stepscope.analyzers.steps.generation import generation_summary, requests_frame, token_latencies
from stepscope.analyzers.steps.phases import PHASES as TRACE_PHASES
from stepscope.analyzers.steps.step_stats import PHASES as STEP_TIMER_PHASES
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.analyzers.trace.breakdown import CATEGORIES
from stepscope.app.formats import fmt_s
from stepscope.store import RunStore
from stepscope.types import Finding

BREAKDOWN_COLUMNS = ["rank", "step", "category", "time_ns", "step_ns", "share"]
KERNEL_COLUMNS = ["name", "class", "count", "total_ns", "mean_ns", "max_ns", "share"]
OPERATOR_COLUMNS = ["name", "count", "self_ns", "total_ns", "mean_self_ns", "share"]
PHASE_COLUMNS = ["source", "rank", "step", "phase", "time_s", "share"]
FINDING_COLUMNS = [
    "class",
    "subtype",
    "title",
    "share",
    "confidence",
    "level",
    "top_fix",
    "predicted_speedup",
]
STEP_COLUMNS = [
    "run_id",
    "rank",
    "step",
    "start_s",
    "end_s",
    "step_time_s",
    "data_wait_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "device_s",
    "batch_size",
    "loss",
    "kind",
    "profiled",
]


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """One row per finding, with ``FINDING_COLUMNS`` (see ``Report.findings``)."""
    rows = [
        {
            "class": f.klass.value,
            "subtype": f.subtype,
            "title": f.title,
            "share": f.share,
            "confidence": f.confidence,
            "level": f.level,
            "top_fix": f.fixes[0].id if f.fixes else None,
            "predicted_speedup": f.fixes[0].predicted_speedup if f.fixes else None,
        }
        for f in findings
    ]
    return pd.DataFrame(rows, columns=FINDING_COLUMNS)


def steps_frame(steps: pd.DataFrame | None) -> pd.DataFrame:
    """The store's steps with ``STEP_COLUMNS`` (see ``Report.steps``)."""
    if steps is None or steps.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    out = steps.assign(step_time_s=(steps["end_s"] - steps["start_s"]).clip(lower=0.0))
    return out.reindex(columns=STEP_COLUMNS).reset_index(drop=True)


def _frame(df: pd.DataFrame | None, columns: list[str]) -> pd.DataFrame:
    """An analysis's table with exactly the documented columns (a failed one: empty)."""
    if df is None or df.empty:
        return pd.DataFrame(columns=columns)
    return df.reindex(columns=columns).reset_index(drop=True)


class Report:
    """One analysis of trace files or of a recorded run, as DataFrames.

    Made by ``stepscope.analyze``. The parts (``breakdown``, ``kernels``,
    ``operators``, ``phases``, ``findings``, ``steps``, ``requests``, ``tokens``) are
    computed on first use and kept; ``diagnosis``, ``summary`` and ``trace_report`` are the objects they come
    from. A report of a run without a trace has empty trace parts, with their columns.
    """

    def __init__(
        self,
        trace_report: TraceReport | None,
        *,
        run_id: int | None = None,
        home: Path | None = None,
        steps: pd.DataFrame | None = None,
        requests: pd.DataFrame | None = None,
    ) -> None:
        self.trace_report = trace_report
        self.run_id = run_id
        self.home = home
        self.paths: list[str] = list(trace_report.paths) if trace_report is not None else []
        self._steps = steps
        self._requests = requests  # the store's rows (a generation run's), or None

    # -- the raw objects ----------------------------------------------------------
    @cached_property
    def diagnosis(self) -> Diagnosis:
        """The findings with their evidence and fixes; a run's uses all its evidence.

        Not saved to the store: analysing in a notebook leaves the run's recorded
        diagnosis as it was (``stepscope analyze RUN`` saves it).
        """
        if self.run_id is None:
            assert self.trace_report is not None
            return diagnose_report(self.trace_report)
        with RunStore(self.home) as store:
            return diagnose_run(store, self.run_id, report=self.trace_report, save=False)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """``{"trace": ..., "steps": ..., "generation": ...}``: the trace's summary (ranks,
        events, steps, mean step in ns, devices), a run's step figures
        (``summarize_steps``: median step time, samples/s, data-wait share, warm-up) and
        its requests' figures (``generation_summary``, what ``stepscope show`` prints);
        None where there is none."""
        trace = self.trace_report.summary if self.trace_report is not None else None
        steps = summarize_steps(self._steps) if self.run_id is not None else None
        generation = generation_summary(self._requests, self._steps)
        return {"trace": trace, "steps": steps, "generation": generation}

    @property
    def warnings(self) -> list[str]:
        """What the trace analyses and the diagnosis could not do, one line each."""
        trace = self.trace_report.warnings if self.trace_report is not None else []
        return [*trace, *self.diagnosis.warnings]

    # -- the parts ----------------------------------------------------------------
    @cached_property
    def breakdown(self) -> pd.DataFrame:
        """Step-time breakdown of the trace: one row per (rank, step, category).

        Columns: ``rank``, ``step`` (the ``ProfilerStep#`` number), ``category`` (one
        of ``stepscope.analyzers.trace.breakdown.CATEGORIES``, torch-tb-profiler's: Kernel,
        Memcpy, Memset, Communication, Runtime, DataLoader, CPU Exec, Other, in that
        order), ``time_ns`` (the category's time in the step, by priority subtraction:
        the categories of a step add up to it), ``step_ns`` (the step's wall time) and
        ``share`` (time_ns / step_ns). Overall shares:
        ``b.groupby("category", sort=False)[["time_ns", "step_ns"]].sum()``, then divide.
        """
        if self.trace_report is None or self.trace_report.per_step.empty:
            return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
        per = self.trace_report.per_step
        n = len(per)
        step_ns = np.repeat(per["duration"].to_numpy(), len(CATEGORIES))
        time_ns = per[CATEGORIES].to_numpy().reshape(-1)  # row-major: step by step
        share = np.divide(
            time_ns, step_ns, out=np.zeros(time_ns.size, dtype=float), where=step_ns > 0
        )
        return pd.DataFrame(
            {
                "rank": np.repeat(per["rank"].to_numpy(), len(CATEGORIES)),
                "step": np.repeat(per["step"].to_numpy(), len(CATEGORIES)),
                "category": np.tile(np.array(CATEGORIES, dtype=object), n),
                "time_ns": time_ns,
                "step_ns": step_ns,
                "share": share,
            },
            columns=BREAKDOWN_COLUMNS,
        )

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """The 50 device kernels (and copies, sets) with the most total time, most first.

        Columns: ``name``, ``class`` (gemm_conv, elementwise, reduction, normalization,
        communication, memcpy, memset, other), ``count``, ``total_ns``, ``mean_ns``,
        ``max_ns``, ``share`` (of all device-work time, all ranks). Empty on CPU-only
        traces and without a trace.
        """
        report = self.trace_report
        return _frame(report.kernels_top if report is not None else None, KERNEL_COLUMNS)

    @cached_property
    def operators(self) -> pd.DataFrame:
        """Every CPU operator (``cpu_op``) by name, most self time first.

        Columns: ``name``, ``count``, ``self_ns`` (time not spent in nested operators,
        runtime calls or annotations), ``total_ns``, ``mean_self_ns``, ``share`` (of all
        operators' self time).
        """
        report = self.trace_report
        return _frame(report.ops_top if report is not None else None, OPERATOR_COLUMNS)

    @cached_property
    def phases(self) -> pd.DataFrame:
        """What each step is made of, phase by phase.

        One row per (source, rank, step, phase). Columns: ``source`` ('trace': the
        profiled steps, from the trace's annotations, ``stepscope.analyzers.steps.phases``:
        data_wait, forward, backward, optimizer, communication (exposed), sync, other;
        'steps': every step the step timer recorded, from its hooks: data_wait, forward,
        backward, optimizer, other; a run recorded before the timer had phases has
        data_wait and other only), ``rank``, ``step``, ``phase``, ``time_s`` and ``share``
        (of the step; a step's shares add up to 1). A run with both has both sources.
        """
        frames = [f for f in (self._trace_phases(), self._step_phases()) if not f.empty]
        if not frames:
            return pd.DataFrame(columns=PHASE_COLUMNS)
        return pd.concat(frames, ignore_index=True)[PHASE_COLUMNS]

    @cached_property
    def findings(self) -> pd.DataFrame:
        """The diagnosis, one row per finding, most costly first (the diagnosis's order).

        Columns: ``class`` ('io', 'compute', 'memory', 'communication'), ``subtype``
        (e.g. 'input_pipeline'), ``title``, ``share`` (of step time, 0..1; None when the
        finding has none, an out-of-memory error), ``confidence`` (0..1), ``level`` (the
        evidence: 'trace', 'steps', 'stacks', 'samples'), ``top_fix`` (id of the first
        recommended fix, None without one) and ``predicted_speedup`` (its bound for this
        run, None when it has none). The ``Finding`` objects: ``diagnosis.findings``.
        """
        return findings_frame(self.diagnosis.findings)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """A run's recorded steps, every one (warm-up and profiled included); empty for
        trace files.

        Columns: ``run_id``, ``rank``, ``step`` (0-based per rank), ``start_s``/``end_s``
        (unix seconds, host clock), ``step_time_s`` (end - start), ``data_wait_s``
        (blocked in the DataLoader's ``__next__``), ``forward_s``/``backward_s``/
        ``optimizer_s`` (host time in each, exclusive of the others; NULL on runs recorded
        before stepscope had them), ``device_s`` (CUDA events, on CUDA
        only), ``batch_size``, ``loss``, ``kind`` ('optimizer', 'forward' or 'mark':
        what ended the step) and ``profiled`` (1 inside a profiler capture).
        """
        return steps_frame(self._steps)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """A text-generation run's requests, one row per ``generate()`` call or decode
        loop (``analyzers/steps/generation.py``); empty for any other run and for trace files.

        Columns: ``rank``, ``request`` (0-based per rank), ``step`` (the step it was, None
        until it ended or in a training job), ``source`` ('generate' or 'loop'), ``status``
        ('done', 'error', or 'running': unfinished in an ended run), ``rows`` (batch rows),
        ``prompt_tokens``/``new_tokens`` (all rows), ``latency_s`` (the call), ``ttft_s``
        (to the first token), ``tpot_s`` (per output token after it), ``tokens_per_s``,
        ``prefill_s``/``decode_s`` (the first forward / the others) and ``other_s`` (the
        rest: sampling, the loop's own work). Timings are NaN where it did not finish.
        """
        return requests_frame(self._requests)

    @cached_property
    def tokens(self) -> pd.DataFrame:
        """One row per decoded token of the finished requests (``token_latencies``): the
        KV-cache picture. Columns: ``rank``, ``request``, ``position`` (context length it
        was computed over), ``offset_s`` (its forward's start, from the request's),
        ``forward_s`` (the forward's own time), ``latency_s`` (to the next token). Per
        position: ``t.groupby("position")["latency_s"].median()``; empty without requests.
        """
        return token_latencies(self._requests)

    # -- helpers ------------------------------------------------------------------
    def _trace_phases(self) -> pd.DataFrame:
        report = self.trace_report
        if report is None or report.phases is None or report.phases.empty:
            return pd.DataFrame(columns=PHASE_COLUMNS)
        per = report.phases
        times = per[list(TRACE_PHASES)].to_numpy(dtype=float) / 1e9
        return _phase_rows("trace", per["rank"], per["step"], TRACE_PHASES, times)

    def _step_phases(self) -> pd.DataFrame:
        steps = self.steps
        if steps.empty:
            return pd.DataFrame(columns=PHASE_COLUMNS)
        step_s = steps["step_time_s"].to_numpy(dtype=float)
        columns = [c for c in STEP_TIMER_PHASES.values() if c is not None]
        timed = [c for c in columns if c in steps and steps[c].notna().all()]
        names = [n for n, c in STEP_TIMER_PHASES.items() if c in timed]
        parts = steps[timed].fillna(0.0).clip(lower=0.0).to_numpy(dtype=float)
        parts = np.minimum(parts, step_s[:, None])
        other = np.maximum(step_s - parts.sum(axis=1), 0.0)
        times = np.column_stack([parts, other])
        return _phase_rows("steps", steps["rank"], steps["step"], (*names, "other"), times)

    def __repr__(self) -> str:
        if self.run_id is not None:
            files = f", {len(self.paths)} trace file(s)" if self.paths else ", no trace"
            head = f"stepscope.Report of run {self.run_id}{files}"
        else:
            names = ", ".join(Path(p).name for p in self.paths[:3])
            more = f" and {len(self.paths) - 3} more" if len(self.paths) > 3 else ""
            head = f"stepscope.Report of {names}{more}"
        lines = [head]
        if self.trace_report is not None:
            s = self.trace_report.summary
            lines.append(
                f"  trace: ranks {s['ranks']}, {s['steps']} step(s), mean step "
                f"{fmt_s(s['mean_step_ns'] / 1e9)}" + ("" if s["has_device"] else " (CPU only)")
            )
        if self.run_id is not None:
            figures = self.summary["steps"] or {}
            lines.append(
                f"  steps: {figures.get('steps', 0)} recorded, median step "
                f"{fmt_s(figures.get('step_time_median_s'))}"
            )
            gen = self.summary["generation"]
            if gen is not None:
                p50 = (gen["request_s"] or {}).get("p50")
                lines.append(
                    f"  requests: {gen['requests']}, {gen['new_tokens']} new tokens, "
                    f"p50 {fmt_s(p50)} per request"
                )
        lines.append(f"  {_top_finding(self.diagnosis)}")
        lines.append(
            "  parts (DataFrames): breakdown, kernels, operators, phases, findings, steps,"
            " requests, tokens; raw: diagnosis, summary, trace_report"
        )
        return "\n".join(lines)


def _phase_rows(
    source: str, rank: pd.Series, step: pd.Series, names: tuple[str, ...], times: np.ndarray
) -> pd.DataFrame:
    """One row per step and phase (``times``: steps x phases, seconds); the shares of a
    step add up to 1."""
    n = len(names)
    time_s = times.reshape(-1)  # row-major: step by step
    total = np.repeat(times.sum(axis=1), n)
    share = np.divide(time_s, total, out=np.zeros_like(time_s), where=total > 0)
    return pd.DataFrame(
        {
            "source": source,
            "rank": np.repeat(rank.to_numpy(), n),
            "step": np.repeat(step.to_numpy(), n),
            "phase": np.tile(np.array(names, dtype=object), len(times)),
            "time_s": time_s,
            "share": share,
        },
        columns=PHASE_COLUMNS,
    )


def _top_finding(diagnosis: Diagnosis) -> str:
    """The first finding in one line, or why there is none."""
    if not diagnosis.findings:
        why = diagnosis.reason or "no bottleneck above the thresholds"
        return f"diagnosis ({diagnosis.level} level): {why}"
    f = diagnosis.findings[0]
    share = "" if f.share is None else f", {100 * f.share:.1f} % of step time"
    more = len(diagnosis.findings) - 1
    rest = f" (+{more} more)" if more else ""
    return (
        f"top finding: {f.klass.label} / {f.subtype}{share} ({diagnosis.level} level): "
        f"{f.title}{rest}"
    )


__all__ = [
    "BREAKDOWN_COLUMNS",
    "FINDING_COLUMNS",
    "KERNEL_COLUMNS",
    "OPERATOR_COLUMNS",
    "PHASE_COLUMNS",
    "STEP_COLUMNS",
    "Report",
    "findings_frame",
    "steps_frame",
]
