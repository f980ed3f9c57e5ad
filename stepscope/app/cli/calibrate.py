"""`stepscope calibrate`: measure this host's matmul FLOP/s and memory bandwidth, and cache it.

A CPU (or any device not in the datasheet table) has no published peak a job can
reach, so the ratios of issue 14 (roofline, MFU) divide by this measurement; it is
cached per host, dtype and thread count in the stepscope home, and shown with its date
and conditions. Progress goes to stderr, so ``--json`` output stays clean on stdout.

``--noise`` measures something else: this host's run-to-run spread, from whole runs of
one small fixed job (``optim_runner/check/run_noise.py``), cached beside the peak; ``stepscope
check`` widens the interval of a side with one run by it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stepscope.app.cli.term import console, esc, print_json, say, table
from stepscope.collectors.facts.calibrate import DEFAULT_SECONDS, calibrate
from stepscope.optim_runner.check.run_noise import measure_noise, noise_refusal
from stepscope.store import default_home
from stepscope.store.calibration import save_calibration


def cmd_calibrate(
    *,
    dtype: str = "float32",
    threads: int | None = None,
    seconds: float = DEFAULT_SECONDS,
    as_json: bool = False,
) -> int:
    err = console(stderr=True, quiet=as_json)
    say(err, f"calibrating this host (about {seconds:g} s; keep other work off the cores)...")
    cal = calibrate(dtype, threads, seconds, progress=lambda msg: say(err, f"  {msg}"))
    path = save_calibration(default_home(), cal)
    if as_json:
        print_json({**cal.to_dict(), "cache": str(path)})
        return 0
    rows = [
        ("matmul", f"{cal.matmul_gflops:,.1f} GFLOP/s ({cal.matmul_size}² {cal.dtype})"),
        ("copy", f"{cal.copy_gbs:,.1f} GB/s"),
        ("triad", f"{cal.triad_gbs:,.1f} GB/s (a = b + s·c, {cal.stream_mib:g} MiB arrays)"),
    ]
    _print_cached(f"calibration of {esc(cal.host)}", rows, cal.conditions(), path)
    return 0


def cmd_calibrate_noise(runs: int, steps: int, threads: int | None, as_json: bool) -> int:
    """``calibrate --noise``: whole runs of the fixed job, their spread, cached."""
    refusal = noise_refusal(runs, steps, threads or 1)
    if refusal is not None:
        print(f"stepscope calibrate --noise: {refusal}", file=sys.stderr)
        return 2
    err = console(stderr=True, quiet=as_json)
    say(err, f"measuring this host's run-to-run spread: {runs} runs of {steps} steps, each a "
             "whole process (about a minute; run it as the checks run, beside the same load)")  # fmt: skip
    try:
        noise = measure_noise(runs, steps, threads or 1, progress=lambda m: say(err, f"  {m}"))
    except (ValueError, RuntimeError) as exc:
        print(f"stepscope calibrate --noise: {exc}", file=sys.stderr)
        return 2
    path = save_calibration(default_home(), noise)
    if as_json:
        print_json({**noise.to_dict(), "cache": str(path)})
        return 0
    rows = [
        (f"{stat} step", f"{sd * 100:.1f} % between runs (sd of the log)")
        for stat, sd in noise.cv.items()
    ]
    _print_cached(f"run-to-run spread of {esc(noise.host)}", rows, noise.conditions(), path)
    return 0


def _print_cached(title: str, rows: list[tuple[str, str]], conditions: str, path: Path) -> None:
    """A measurement's table: its figures, the conditions it was taken in, its cache file."""
    tab = table(title, show_header=False)
    tab.add_column("what", style="bold")
    tab.add_column("value")
    for what, value in rows:
        tab.add_row(what, value)
    tab.add_row("conditions", esc(conditions))
    tab.add_row("cached in", esc(path))
    console().print(tab)


__all__ = ["cmd_calibrate", "cmd_calibrate_noise"]
