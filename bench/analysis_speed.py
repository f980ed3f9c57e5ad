"""Analysis speed and peak memory: stepscope vs HTA vs torch-tb-profiler vs the JSON floor.

All tools run in one invocation, side by side, on the same traces, repetitions
interleaved (rep 1 of every tool, then rep 2, ...) so that load from other jobs on
the machine hits all tools alike. Every measurement is a fresh child process, and
its peak RSS is read exactly from ``os.wait4``'s rusage for that child.

    python bench/analysis_speed.py [--reps 3] [--synthetic-events 1000000] [--big]
                                   [--tools floor,floor_nogc,stepscope,hta,tb] [--json OUT]

Two views, both medians over the repetitions:

* **work**: the tool's work inside the child (``--child TOOL TRACE``), its imports
  done before the clock starts. floor: gunzip + ``orjson.loads``; floor_nogc: the
  same with the cyclic GC paused (as stepscope's loader does; a reference, not a
  goal); stepscope: ``analyze_trace`` (load + full analysis); HTA: parse + temporal
  + idle-time breakdown; tb-profiler: ``RunProfileData`` parse / process / analyze +
  ``RunGenerator``. RSS: that child's peak.
* **end-to-end**: wall time of the whole fresh process, i.e. what a user waits for:
  interpreter start, imports, parse, analysis. For stepscope that is the real console
  script, ``stepscope analyze TRACE --json > /dev/null`` (so the CLI's import cost
  counts); for the others it is the ``--child`` process above (its harness adds only
  stdlib imports, ~10 ms). RSS: that process's peak.

Ratios: ``x floor`` is time (or RSS) over the floor's in the same view (goal for
stepscope: <= 1.5); ``vs stepscope`` is the tool's time over stepscope's in the same
view (goal: >= 5 for HTA and tb). Results also go to ``bench/results/analysis_speed.json``.

``--big`` also writes a ~1 GB synthetic trace (uncompressed JSON) and runs only
stepscope and the floors on it (goal: within 24 GB of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "data"
BENCH_DIR = Path(tempfile.gettempdir()) / "stepscope_bench"

RESULTS = REPO / "bench" / "results" / "analysis_speed.json"
TOOLS = ("floor", "floor_nogc", "stepscope", "hta", "tb")
GOALS = {"vs_tool": 5.0, "x_floor_time": 1.5, "x_floor_rss": 1.5}


# -- children: one tool, one trace, report work time ------------------------------------


def _child_floor(path: Path) -> Callable[[], None]:
    import gzip

    import orjson

    def work() -> None:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = orjson.loads(data)
        del data
        assert doc

    return work


def _child_floor_nogc(path: Path) -> Callable[[], None]:
    import gc

    floor = _child_floor(path)

    def work() -> None:
        gc.disable()
        try:
            floor()
        finally:
            gc.enable()

    return work


def _child_stepscope(path: Path) -> Callable[[], None]:
    try:
        from stepscope.analyzers.report.trace_report import analyze_trace
    except ImportError:
        analyze_trace = None
    if analyze_trace is not None:
        return lambda: analyze_trace([path])
    # until the full report exists: the loader and the analyses that are written
    from stepscope.analyzers.trace.communication import communication_summary
    from stepscope.analyzers.trace.idle_time import idle_time_breakdown
    from stepscope.analyzers.trace.load import load_trace
    from stepscope.analyzers.trace.memory import memory_curve, memory_summary
    from stepscope.analyzers.trace.temporal import temporal_breakdown

    def work() -> None:
        trace = load_trace([path])
        temporal_breakdown(trace)
        idle_time_breakdown(trace)
        communication_summary(trace)
        memory_summary(trace)
        memory_curve(trace)

    return work


def _child_hta(path: Path) -> Callable[[], None]:
    import contextlib
    import io
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)

    def work() -> None:
        with tempfile.TemporaryDirectory(prefix="hta_speed_") as tmp:
            name = path.name if path.name.endswith((".json", ".gz")) else path.name + ".json"
            os.symlink(path, Path(tmp) / name)
            with contextlib.redirect_stdout(io.StringIO()):
                analysis = TraceAnalysis(trace_dir=tmp)
                analysis.get_temporal_breakdown(visualize=False)
                analysis.get_idle_time_breakdown(visualize=False)

    return work


def _child_tb(path: Path) -> Callable[[], None]:
    import logging

    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    logging.disable(logging.WARNING)

    def work() -> None:
        data = RunProfileData.parse("worker0", "span", str(path), None)
        data.process()
        data.analyze()
        RunGenerator("worker0", "span", data).generate_run_profile()

    return work


_CHILDREN = {
    "floor": _child_floor,
    "floor_nogc": _child_floor_nogc,
    "stepscope": _child_stepscope,
    "hta": _child_hta,
    "tb": _child_tb,
}


def _child_main(tool: str, path: Path) -> int:
    import warnings

    warnings.simplefilter("ignore")
    # the tool's imports happen before the clock starts; ``proc s`` includes them
    work_fn = _CHILDREN[tool](path)
    t0 = time.perf_counter()
    work_fn()
    work = time.perf_counter() - t0
    print(json.dumps({"work_s": work}))
    return 0


# -- parent: spawn, measure, summarise ---------------------------------------------------


def _run(
    cmd: list[str], timeout: float, keep_stdout: bool = True
) -> tuple[float, float, bytes, str | None]:
    """Run one process; (wall s, peak RSS MB, stdout, error).

    Its own rusage (wait4) gives the exact peak RSS of that process. Output goes to
    temporary files (or /dev/null when not kept), never to pipes: a process writing
    more than a pipe buffer (the CLI's JSON report) would block until read.
    """
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        stdout = out_f if keep_stdout else subprocess.DEVNULL
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=err_f, cwd=REPO)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                return 0.0, 0.0, b"", f"timed out after {timeout:.0f} s"
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 already
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return wall, 0.0, out, last[0][:200]
    return wall, usage.ru_maxrss / 1024, out, None  # Linux: kilobytes


def _stepscope_cli() -> list[str]:
    """The installed console script (what a user runs), else the module as a fallback."""
    script = Path(sys.executable).with_name("stepscope")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stepscope.app.cli"]


def measure(tool: str, path: Path, timeout: float) -> dict:
    """One repetition of one tool: the work child, plus the CLI process for stepscope."""
    wall, rss, out, error = _run([sys.executable, __file__, "--child", tool, str(path)], timeout)
    if error:
        return {"error": error}
    r = {"work_s": json.loads(out.decode().strip().splitlines()[-1])["work_s"], "work_rss_mb": rss}
    if tool == "stepscope":
        cmd = [*_stepscope_cli(), "analyze", str(path), "--json"]
        wall, rss, _, error = _run(cmd, timeout, keep_stdout=False)
        if error:
            return {"error": f"stepscope analyze: {error}"}
    r |= {"e2e_s": wall, "e2e_rss_mb": rss}
    return r


_KEYS = ("work_s", "work_rss_mb", "e2e_s", "e2e_rss_mb")


def bench_trace(path: Path, tools: list[str], reps: int, timeout: float) -> dict[str, dict]:
    """Medians per tool; repetitions interleaved across tools (see the module docstring)."""
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    errors: dict[str, dict] = {}
    for rep in range(reps):
        for tool in tools:
            if tool in errors:
                continue
            r = measure(tool, path, timeout)
            if "error" in r:
                errors[tool] = r
            else:
                runs[tool].append(r)
            print(f"  {path.name:48s} rep {rep + 1} {tool:10s} {r}", file=sys.stderr)
    results: dict[str, dict] = {}
    for tool in tools:
        if tool in errors:
            results[tool] = errors[tool]
        else:
            results[tool] = {k: statistics.median(r[k] for r in runs[tool]) for k in _KEYS}
            results[tool]["reps"] = len(runs[tool])
            results[tool]["runs"] = runs[tool]
    _add_ratios(results)
    return results


def _add_ratios(res: dict[str, dict]) -> None:
    """x floor (time and RSS, per view) and tool time over stepscope's (per view)."""
    floor, ss = res.get("floor", {}), res.get("stepscope", {})
    for tool, r in res.items():
        if "error" in r:
            continue
        for view in ("work", "e2e"):
            if "work_s" in floor:
                r[f"{view}_x_floor"] = r[f"{view}_s"] / floor[f"{view}_s"]
                r[f"{view}_rss_x_floor"] = r[f"{view}_rss_mb"] / floor[f"{view}_rss_mb"]
            if "work_s" in ss and tool not in ("stepscope", "floor", "floor_nogc"):
                r[f"{view}_vs_stepscope"] = r[f"{view}_s"] / ss[f"{view}_s"]


def goals(res: dict[str, dict]) -> dict[str, dict[str, bool | None]]:
    """Per view: is each goal of the issue met on this trace (None: not measured)?"""
    ss = res.get("stepscope", {})
    out: dict[str, dict[str, bool | None]] = {}
    for view in ("work", "e2e"):
        g: dict[str, bool | None] = {}
        for tool in ("hta", "tb"):
            v = res.get(tool, {}).get(f"{view}_vs_stepscope")
            g[f"5x vs {tool}"] = None if v is None else v >= GOALS["vs_tool"]
        x, rx = ss.get(f"{view}_x_floor"), ss.get(f"{view}_rss_x_floor")
        g["<=1.5x floor wall"] = None if x is None else x <= GOALS["x_floor_time"]
        g["<=1.5x floor RSS"] = None if rx is None else rx <= GOALS["x_floor_rss"]
        out[view] = g
    return out


def _label(trace: str) -> str:
    """A short trace label for the table (the JSON keeps the file name)."""
    for suffix in (".pt.trace.json.gz", ".json.gz", ".json"):
        trace = trace.replace(suffix, "")
    return trace


def print_table(all_results: dict[str, dict[str, dict]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Trace analysis: wall time and peak RSS (medians, fresh process each)")
    cols = (
        "trace",
        "tool",
        "work s",
        "work RSS MB",
        "work x floor (s / RSS)",
        "work vs stepscope",
        "e2e s",
        "e2e RSS MB",
        "e2e x floor (s / RSS)",
        "e2e vs stepscope",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("trace", "tool") else "right")

    def ratio(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else ""

    for trace, res in all_results.items():
        for tool, r in res.items():
            if "error" in r:
                table.add_row(
                    _label(trace), tool, "failed", r["error"][:60], *[""] * (len(cols) - 4)
                )
                continue
            row = [_label(trace), tool]
            for view in ("work", "e2e"):
                xf = (
                    f"{r[f'{view}_x_floor']:.2f} / {r[f'{view}_rss_x_floor']:.2f}"
                    if f"{view}_x_floor" in r
                    else ""
                )
                row += [
                    f"{r[f'{view}_s']:.2f}",
                    f"{r[f'{view}_rss_mb']:.0f}",
                    xf,
                    ratio(r, f"{view}_vs_stepscope", ".1f")
                    + ("x" if f"{view}_vs_stepscope" in r else ""),
                ]
            table.add_row(*row)
        table.add_section()
    console = Console(width=190)
    console.print(table)
    for trace, res in all_results.items():
        for view, g in goals(res).items():
            marks = ", ".join(
                f"{k}: {'-' if v is None else 'met' if v else 'NOT met'}" for k, v in g.items()
            )
            console.print(f"{_label(trace)} ({view}): {marks}", markup=False, highlight=False)


def _conditions() -> dict:
    """What the numbers were measured under: they are only comparable within one run."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in (
        "stepscope",
        "HolisticTraceAnalysis",
        "torch-tb-profiler",
        "pandas",
        "numpy",
        "orjson",
    ):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "versions": versions,
        "stepscope_cli": _stepscope_cli(),
    }


def _synthetic(events: int, suffix: str) -> Path:
    """Generate (once, cached in the temp dir) a synthetic trace of about ``events`` events."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    path = BENCH_DIR / f"synthetic_{events}{suffix}"
    if not path.exists():
        tmp = path.with_name(path.name + ".part" + suffix)
        subprocess.run(
            [
                sys.executable,
                str(REPO / "bench" / "synthetic_trace.py"),
                str(tmp),
                "--events",
                str(events),
            ],
            check=True,
        )
        tmp.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child_main(argv[1], Path(argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--synthetic-events", type=int, default=1_000_000)
    parser.add_argument("--big", action="store_true", help="also a ~1 GB trace (stepscope, floor)")
    parser.add_argument("--big-events", type=int, default=5_000_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"results file ({RESULTS})")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]

    traces = [
        TRACES / "resnet50_v100_num_workers_0.pt.trace.json.gz",
        TRACES / "v100_ddp_rank0_ns_resolution.pt.trace.json.gz",
        TRACES / "a100_nccl_3steps.json.gz",
    ]
    missing = [p for p in traces if not p.exists()]
    if missing:
        print(f"test traces missing: {[str(p) for p in missing]}", file=sys.stderr)
        return 2
    if args.synthetic_events > 0:
        traces.append(_synthetic(args.synthetic_events, ".json.gz"))

    conditions = _conditions()
    results: dict[str, dict] = {}
    for path in traces:
        results[path.name] = bench_trace(path, tools, args.reps, args.timeout)

    if args.big:
        import psutil

        big = _synthetic(args.big_events, ".json")
        size_gb = big.stat().st_size / 1e9
        avail = psutil.virtual_memory().available / 1e9
        print(f"big trace: {big} ({size_gb:.2f} GB); {avail:.1f} GB available", file=sys.stderr)
        big_tools = [t for t in ("floor", "floor_nogc", "stepscope") if t in tools]
        results[f"{big.name} ({size_gb:.2f} GB)"] = bench_trace(
            big, big_tools, max(1, min(args.reps, 1)), args.timeout
        )

    conditions["loadavg_end"] = os.getloadavg()
    conditions["reps"] = args.reps
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "conditions": conditions,
        "goals": {t: goals(r) for t, r in results.items()},
        "results": results,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"results: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
