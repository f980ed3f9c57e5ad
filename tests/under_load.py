"""Run pytest with CPU-bound processes beside it: is a test steady on a busy machine?

A test that reads time (sampler ticks, a trial's limit, a share crossing a threshold)
may pass on an idle machine and fail on a shared one. This runs the given pytest
arguments (a test file, a ``-k`` expression, the whole suite) with ``--busy N`` processes
spinning on the CPU for as long as pytest runs (default 2: with the suite's own two
workers, a load average of about 4 on 2 cores), ``--repeat`` times in a row, and exits
with the first failing run's code.

``--slow`` simulates a slower machine, not only a busier one: pytest and every process it
starts (its workers, the jobs, their samplers) run on one core (CPU affinity, as
``taskset -c`` sets it), and the busy processes spin on that same core, so the session
gets at most 1/(1 + busy) of one core: with ``--busy 1`` half a core, a quarter of what
two idle cores give. The jobs then run several times slower and every share read from
time sees it. torch picks one intra-op thread per job on one core (libgomp reads the
affinity), so threads waiting at a barrier for a descheduled sibling, the other way a
busy machine moves shares, are what plain ``--busy`` on all cores tests. Linux only.

    python tests/under_load.py tests/test_sampler.py
    python tests/under_load.py --busy 2 --repeat 3 -- -q      # the whole suite, three times
    python tests/under_load.py --slow --busy 1 -- -q -n 0 tests/test_examples.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable

SPIN = "while True: pass"


def one_core() -> Callable[[], None]:
    """A pre-exec hook that pins the child (and all it starts) to one core of ours."""
    core = max(os.sched_getaffinity(0))
    return lambda: os.sched_setaffinity(0, {core})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes (default 2)")
    parser.add_argument("--repeat", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument(
        "--slow",
        action="store_true",
        help="a slower machine: pytest and the busy processes share one core",
    )
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest")
    args = parser.parse_args()
    if args.slow and not hasattr(os, "sched_setaffinity"):
        parser.error("--slow needs CPU affinity (os.sched_setaffinity: Linux)")
    pin = one_core() if args.slow else None
    where = "on one core" if args.slow else "on all cores"
    code = 0
    for k in range(args.repeat):
        spin = [sys.executable, "-c", SPIN]
        busy = [subprocess.Popen(spin, preexec_fn=pin) for _ in range(args.busy)]
        started = time.monotonic()
        try:
            pytest = [sys.executable, "-m", "pytest", *args.pytest_args]
            code = subprocess.call(pytest, preexec_fn=pin)
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
        load = os.getloadavg()[0]
        print(
            f"under_load: run {k + 1}/{args.repeat} exit {code} in "
            f"{time.monotonic() - started:.0f} s beside {args.busy} busy processes "
            f"{where} (load average {load:.1f} at the end)",
            file=sys.stderr,
        )
        if code != 0:
            return code
    return code


if __name__ == "__main__":
    sys.exit(main())
