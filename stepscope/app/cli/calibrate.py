"""`stepscope calibrate`: measure this host's matmul FLOP/s and memory bandwidth, and cache it.

A CPU (or any device not in the datasheet table) has no published peak a job can
reach, so the ratios of issue 14 (roofline, MFU) divide by this measurement; it is
cached per host, dtype and thread count in the stepscope home, and shown with its date
and conditions. Progress goes to stderr, so ``--json`` output stays clean on stdout.
"""

from __future__ import annotations

from stepscope.app.cli.term import console, esc, print_json, say, table
from stepscope.collectors.calibrate import DEFAULT_SECONDS, calibrate
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
    out = console()
    tab = table(f"calibration of {esc(cal.host)}", show_header=False)
    tab.add_column("what", style="bold")
    tab.add_column("value")
    tab.add_row("matmul", f"{cal.matmul_gflops:,.1f} GFLOP/s ({cal.matmul_size}² {cal.dtype})")
    tab.add_row("copy", f"{cal.copy_gbs:,.1f} GB/s")
    tab.add_row("triad", f"{cal.triad_gbs:,.1f} GB/s (a = b + s·c, {cal.stream_mib:g} MiB arrays)")
    tab.add_row("conditions", esc(cal.conditions()))
    tab.add_row("cached in", esc(path))
    out.print(tab)
    return 0


__all__ = ["cmd_calibrate"]
