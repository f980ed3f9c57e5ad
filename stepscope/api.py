"""The Python API for notebooks: ``analyze``, ``runs``, ``run``, ``compare``, ``diff``, ``check``,
``memory``.

What the CLI does for a terminal, for a notebook: the same analyses, the same store
(``$STEPSCOPE_HOME``, default ``~/.stepscope``, unless ``home`` says otherwise), the same
one-line errors, but returning DataFrames and small objects instead of printing. Read
through ``stepscope.analyze`` etc.: the package imports this module on first use only,
since ``import stepscope`` runs inside every process of the user's job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from stepscope.analyzers.report.run_diff_ops import RunDiff, diff_runs, diff_traces
from stepscope.analyzers.report.run_memory import NoMemoryData, run_memory
from stepscope.analyzers.report.trace_report import analyze_trace
from stepscope.analyzers.steps.generation import generation_summary, requests_frame, token_latencies
from stepscope.analyzers.steps.run_figures import listed_figures
from stepscope.analyzers.steps.step_stats import summarize_steps
from stepscope.analyzers.trace.load import TraceError
from stepscope.analyzers.trace.memory_peak import MemoryBreakdown
from stepscope.app.formats import fmt_s, missing, speed_caption
from stepscope.optim_runner.check.perf_check import (
    DEFAULT_MAX_SLOWDOWN,
    CheckResult,
    check_runs,
    parse_slowdown,
)
from stepscope.optim_runner.speedup.speed import Speed, compare_speed
from stepscope.optim_runner.speedup.stats import SpeedupCI
from stepscope.report import Report, findings_frame, steps_frame
from stepscope.store import RunNotFound, RunStore, StoreError, default_home
from stepscope.store.artifacts import ArtifactError, kind_files

PathLike = str | os.PathLike[str]

RUNS_COLUMNS = [
    "id",
    "name",
    "status",
    "exit_code",
    "steps",
    "started_at",
    "ended_at",
    "duration_s",
    "command",
    "error",
    "stop_reason",
    "step_time_median_s",
    "samples_per_s",
    "data_wait_share",
    "top_finding",
]
RATIO_COLUMNS = ["ratio", "lo", "hi", "confidence", "verdict", "n_baseline", "n_candidate"]


def analyze(
    path_or_run: PathLike | Sequence[PathLike] | int | Run, home: PathLike | None = None
) -> Report:
    """Analyse Kineto trace files or a recorded run; returns a ``Report`` of DataFrames.

    ``path_or_run``: a trace file (``*.pt.trace.json[.gz]``), a folder of them or a list
    of either (several ranks), as ``stepscope analyze`` takes them; or a run of the store
    at ``home``: its id, a ``Run``, or as the CLI takes it, a name or 'last' (a string
    that is no file). A run is analysed with its trace artifacts, if it has any, and
    diagnosed with all its evidence (steps, samples, facts); nothing is saved.
    Raises ``TraceError`` naming the file for unreadable input, and for a string that is
    neither a file nor a run, with the CLI's words.
    """
    if isinstance(path_or_run, Run):
        return _analyze_run(path_or_run.id, path_or_run.home if home is None else home)
    if isinstance(path_or_run, int) and not isinstance(path_or_run, bool):
        return _analyze_run(path_or_run, home)
    if isinstance(path_or_run, str) and not Path(path_or_run).expanduser().exists():
        try:
            with RunStore(home) as store:
                run_id = store.resolve_run(path_or_run)
        except (RunNotFound, StoreError):
            raise TraceError(f"{path_or_run}: no such file, folder or run") from None
        return _analyze_run(run_id, home)
    if isinstance(path_or_run, (str, os.PathLike)):
        paths = [Path(path_or_run).expanduser()]
    else:
        paths = [Path(p).expanduser() for p in path_or_run]
    return Report(analyze_trace(paths, calibration_home=home or default_home()))


def _analyze_run(ref: int | str, home: PathLike | None) -> Report:
    """The CLI's ``stepscope analyze RUN``: its traces (a bad one is an error), its steps."""
    with RunStore(home) as store:
        run_id = store.resolve_run(ref)
        arts = store.artifacts(run_id)
        steps = store.steps(run_id)
        requests = store.requests(run_id)
        store_home = store.home
    try:  # an uploaded trace is read from the artifact cache (store/artifacts.py)
        traces = kind_files(arts, store_home, "trace")
    except ArtifactError as exc:
        raise TraceError(str(exc)) from None
    trace = analyze_trace(traces, calibration_home=store_home) if traces else None
    return Report(trace, run_id=run_id, home=store_home, steps=steps, requests=requests)


def runs(home: PathLike | None = None) -> pd.DataFrame:
    """The recorded runs of the store at ``home``, newest first: what ``stepscope runs``
    lists, plus the step figures the dashboard's runs table shows.

    Columns: ``id``, ``name``, ``status`` (running, completed, failed, stopped,
    interrupted, killed, lost), ``exit_code``, ``steps`` (rows over all ranks),
    ``started_at``/``ended_at`` (unix seconds), ``duration_s``, ``command`` (argv list),
    ``error`` (one line: why it failed), ``stop_reason``, ``step_time_median_s``,
    ``samples_per_s``, ``data_wait_share`` (timed steps: warm-up and profiled steps left
    out) and ``top_finding`` ('class/subtype' of the recorded diagnosis's first finding,
    None when the run was never diagnosed).
    """
    rows = []
    with RunStore(home) as store:
        table = store.runs()
        top = store.top_findings()
        listed = listed_figures(store, table)  # kept once a run ended: one query for all
        for rec in table.to_dict("records"):
            rec = {k: None if missing(v) else v for k, v in rec.items()}  # NaN -> None
            run_id = int(rec["id"])
            figures = listed[run_id]
            finding = top.get(run_id)
            rows.append(
                {
                    "id": run_id,
                    "name": rec["name"],
                    "status": rec["status"],
                    "exit_code": None if rec["exit_code"] is None else int(rec["exit_code"]),
                    "steps": int(rec["steps"]),
                    "started_at": rec["started_at"],
                    "ended_at": rec["ended_at"],
                    "duration_s": _duration(rec),
                    "command": rec["command"],
                    "error": rec["error"],
                    "stop_reason": rec["stop_reason"],
                    "step_time_median_s": figures["step_time_median_s"],
                    "samples_per_s": figures["samples_per_s"],
                    "data_wait_share": figures["data_wait_share"],
                    "top_finding": None if finding is None else finding.key,
                }
            )
    return pd.DataFrame(rows, columns=RUNS_COLUMNS)


def _duration(run: dict[str, Any]) -> float | None:
    """Wall time of a finished run; of a running one, so far."""
    start = run.get("started_at")
    if start is None:
        return None
    end = run.get("ended_at")
    if end is None:
        return time.time() - start if run.get("status") == "running" else None
    return float(end - start)


class Run:
    """One recorded run: its row, its steps, its requests and its recorded findings.

    Made by ``stepscope.run(id)``. The row is read when the object is made; ``steps``,
    ``summary``, ``requests``, ``tokens``, ``generation`` and ``findings`` on first use (a running job's keep what they read then:
    ask ``stepscope.run`` again for fresh ones).
    """

    def __init__(self, ref: int | str, home: PathLike | None = None) -> None:
        with RunStore(home) as store:
            self.id = store.resolve_run(ref)
            self.row: dict[str, Any] = store.run(self.id)
            self.home = store.home

    @property
    def name(self) -> str:
        return str(self.row["name"])

    @property
    def status(self) -> str:
        return str(self.row["status"])

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Every recorded step; columns as ``Report.steps``."""
        with RunStore(self.home) as store:
            return steps_frame(store.steps(self.id))

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The step figures ``stepscope show`` prints (``summarize_steps``)."""
        return summarize_steps(self.steps)

    @cached_property
    def _requests(self) -> pd.DataFrame:
        """The store's request rows, read once for the three views below."""
        with RunStore(self.home) as store:
            return store.requests(self.id)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """A text-generation run's requests, one row per request; columns as
        ``Report.requests``; empty for a run that served none."""
        return requests_frame(self._requests)

    @cached_property
    def tokens(self) -> pd.DataFrame:
        """Per decoded token, its position and latencies; columns as ``Report.tokens``."""
        return token_latencies(self._requests)

    @cached_property
    def generation(self) -> dict[str, Any] | None:
        """The request figures ``stepscope show`` prints (``generation_summary``: requests,
        tokens, p50/p90/p99/mean of request latency, TTFT, TPOT in seconds, tokens/s,
        the prefill / decode / other split); None for a run that served no request."""
        return generation_summary(self._requests, self.steps)

    @cached_property
    def findings(self) -> pd.DataFrame:
        """The recorded diagnosis (by ``stepscope analyze`` or the dashboard), one row per
        finding, columns as ``Report.findings``; empty when it was never diagnosed.
        ``analyze()`` diagnoses it afresh."""
        with RunStore(self.home) as store:
            return findings_frame(store.findings(self.id))

    def analyze(self) -> Report:
        """``stepscope.analyze`` of this run: its traces, steps and samples."""
        return _analyze_run(self.id, self.home)

    def __repr__(self) -> str:
        top = self.findings["class"].str.cat(self.findings["subtype"], sep="/")
        finding = f", top finding {top.iloc[0]}" if len(top) else ""
        gen = self.generation
        if gen is not None:  # its steps are its requests: say so in the request's words
            p50 = (gen["request_s"] or {}).get("p50")
            what = f"{gen['requests']} requests, median request {fmt_s(p50)}"
        else:
            what = (
                f"{len(self.steps)} steps, median step {fmt_s(self.summary['step_time_median_s'])}"
            )
        return f"stepscope.Run {self.id} {self.name!r} ({self.status}): {what}{finding}"


def memory(ref: int | str | Run, home: PathLike | None = None) -> MemoryBreakdown:
    """Where the peak of a run's last capture goes, as DataFrames.

    ``ref``: a ``Run``, an id, a name or 'last'. ``MemoryBreakdown`` (memory_peak.py)
    says what each field holds: the peak by category, the timeline, modules and lines
    live at the peak, and on CUDA the run's allocator snapshot (``allocator``). Raises
    ``RunNotFound`` for an unknown run and ``LookupError`` (``NoMemoryData``) for a run
    with neither a capture's memory timeline nor an allocator snapshot.
    """
    if isinstance(ref, Run):
        ref, home = ref.id, ref.home if home is None else home
    with RunStore(home) as store:
        return run_memory(store, store.resolve_run(ref))


def run(ref: int | str, home: PathLike | None = None) -> Run:
    """One recorded run of the store at ``home``: an id, or a name or 'last' as the CLI
    takes them. Raises ``RunNotFound`` when there is none."""
    return Run(ref, home)


@dataclass(frozen=True)
class Comparison:
    """Run B against run A, with the figures the dashboard's Compare page shows.

    ``speed.throughput``: the ratio of mean seconds per sample A/B (None unless every
    timed step of both runs has its batch size); ``speed.step_time``: the ratio of median
    step times A/B; each a ``SpeedupCI`` (ratio > 1: B is faster) with its bootstrap
    95 % interval and verdict. ``ratios`` has both as a DataFrame.
    """

    a: Run
    b: Run
    speed: Speed

    @property
    def headline(self) -> SpeedupCI | None:
        """Throughput when both runs know their batch sizes, else median step time."""
        return self.speed.headline

    @property
    def problem(self) -> str | None:
        """Why there is no ratio at all (too few timed steps), else None."""
        return self.speed.problem

    @property
    def caption(self) -> str:
        """The ratios in words, as the Compare page words them."""
        return speed_caption(self.speed)

    @property
    def ratios(self) -> pd.DataFrame:
        """Index 'throughput' and 'median_step_time' (the ones there are).

        Columns: ``ratio`` (A/B: > 1 means B is faster), ``lo``/``hi`` (the interval),
        ``confidence`` (0.95), ``verdict`` ('faster', 'slower' or 'no measurable
        change'), ``n_baseline``/``n_candidate`` (timed steps of A and B).
        """
        rows = {
            name: {c: getattr(ci, c) for c in RATIO_COLUMNS}
            for name, ci in (
                ("throughput", self.speed.throughput),
                ("median_step_time", self.speed.step_time),
            )
            if ci is not None
        }
        return pd.DataFrame.from_dict(rows, orient="index", columns=RATIO_COLUMNS)

    @property
    def step_time_median_s(self) -> tuple[float | None, float | None]:
        """Median step time of A and of B (timed steps)."""
        return self.a.summary["step_time_median_s"], self.b.summary["step_time_median_s"]

    @property
    def samples_per_s(self) -> tuple[float | None, float | None]:
        """Throughput of A and of B over their timed steps, all ranks."""
        return self.a.summary["samples_per_s"], self.b.summary["samples_per_s"]

    def __repr__(self) -> str:
        what = self.caption or f"no speed ratio: {self.problem}"
        return f"stepscope.Comparison B #{self.b.id} vs A #{self.a.id}: {what}"


def compare(a: int | str | Run, b: int | str | Run, home: PathLike | None = None) -> Comparison:
    """How much faster run B is than run A (the baseline), decided as experiments do."""
    run_a = a if isinstance(a, Run) else Run(a, home)
    run_b = b if isinstance(b, Run) else Run(b, home)
    return Comparison(run_a, run_b, compare_speed(run_a.steps, run_b.steps))


def check(
    run: int | str | Run,
    against: int | str | Run,
    max_slowdown: float | str = DEFAULT_MAX_SLOWDOWN,
    home: PathLike | None = None,
    operators: bool = True,
    runs: int | str = "auto",
    inconclusive: str = "pass",
) -> CheckResult:
    """Is ``run`` measurably slower than ``against`` (its baseline)? What `stepscope check`
    decides, for a notebook or a script that gates on it: ``result.passed``,
    ``result.exit_code`` (0 pass, 1 slower, 2 cannot compare, 3 inconclusive with
    ``inconclusive="fail"``), ``result.verdict`` (also "inconclusive": time it could not
    judge without run-to-run spread), ``result.figures`` (each with its interval and how
    it was made), ``result.operators`` (a DataFrame of the operators that regressed, or
    None). Runs as the CLI takes them: ids, names, tags, 'last'. ``max_slowdown``: 0.05
    or "5%"; ``runs``: "auto" (each side's newest runs of its name, up to 5, judged over
    when each side has 3) or N (1: one against one). Raises ``RunNotFound`` for an
    unknown run or tag.
    """
    refs = [r.id if isinstance(r, Run) else r for r in (run, against)]
    allowed = parse_slowdown(max_slowdown)  # this edge takes "5%" too; check_runs the fraction
    with RunStore(home) as store:
        return check_runs(
            store, refs[0], refs[1], allowed, operators, runs, inconclusive=inconclusive
        )


def diff(
    a: int | str | Run | PathLike, b: int | str | Run | PathLike, home: PathLike | None = None
) -> RunDiff:
    """What changed from ``a`` to ``b``, operator by operator: runs (ids, names, tags,
    'last') or two trace files/folders. ``.ops`` (operators and kernels) and
    ``.categories`` (trace categories, step-timer phases) are DataFrames, biggest change
    first, each change with its 95 % interval and a status; ``.warnings`` say what is thin.
    """
    refs = [r.id if isinstance(r, Run) else r for r in (a, b)]
    if all(isinstance(r, (str, os.PathLike)) and Path(r).expanduser().exists() for r in refs):
        return diff_traces(Path(refs[0]).expanduser(), Path(refs[1]).expanduser())
    with RunStore(home) as store:
        return diff_runs(store, store.resolve_run(refs[0]), store.resolve_run(refs[1]))


__all__ = [
    "CheckResult",
    "Comparison",
    "MemoryBreakdown",
    "NoMemoryData",
    "Report",
    "Run",
    "RunDiff",
    "TraceError",
    "analyze",
    "check",
    "compare",
    "diff",
    "memory",
    "run",
    "runs",
]
