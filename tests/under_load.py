"""Run pytest with CPU-bound processes beside it: is a test steady on a busy machine?

A test that reads time (sampler ticks, a trial's limit, a share crossing a threshold)
may pass on an idle machine and fail on a shared one. This runs the given pytest
arguments (a test file, a ``-k`` expression, the whole suite) with ``--busy N`` processes
spinning on the CPU for as long as pytest runs (default 2: with the suite's own two
workers, a load average of about 4 on 2 cores), ``--repeat`` times in a row, and exits
with the first failing run's code.

    python tests/under_load.py tests/test_sampler.py
    python tests/under_load.py --busy 2 --repeat 3 -- -q      # the whole suite, three times
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SPIN = "while True: pass"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes (default 2)")
    parser.add_argument("--repeat", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest")
    args = parser.parse_args()
    code = 0
    for k in range(args.repeat):
        busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
        started = time.monotonic()
        try:
            code = subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args])
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
        load = os.getloadavg()[0]
        print(
            f"under_load: run {k + 1}/{args.repeat} exit {code} in "
            f"{time.monotonic() - started:.0f} s beside {args.busy} busy processes "
            f"(load average {load:.1f} at the end)",
            file=sys.stderr,
        )
        if code != 0:
            return code
    return code


if __name__ == "__main__":
    sys.exit(main())
