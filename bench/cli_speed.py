"""The everyday CLI commands as whole processes, on a store of 1,000 runs (issue 41).

    python bench/cli_speed.py [--runs 1000] [--reps 7] [--baseline DIR] [--json OUT]
                              [--job-steps 40]

Builds a SQLite store of ``--runs`` finished runs (``store_scale.build``: 20 steps and 10
samples each, one run in ten diagnosed), then records one real run last, as a user
does: ``stepscope run`` of ``examples/input_bound.py`` (``--job-steps`` steps, the
default capture, its memory timeline, the verdict's findings), so that ``show last``
shows a realistic run. It tags the second newest run ``base``, and lists the store
once (``stepscope runs --json``: the runs' figures are computed and kept, as after any
first listing) and shows the last run once (its `show` figures kept, as `stepscope run`
leaves them); neither is timed. Then times each command below as a whole process
(interpreter start, imports, the queries, the output written to a pipe): the wall
seconds and the CPU seconds of the process, the median of ``--reps`` runs. The reps
interleave (rep 1 of every command, then rep 2), so load from other work on the machine
hits them alike; a wide min-max says it was noisy.

``--baseline DIR`` times another version of stepscope in the same reps, on a copy of the
same store: DIR holds its ``stepscope`` package (``git archive REV stepscope | tar -x
-C DIR``), put first on PYTHONPATH. The store is built and the real run recorded by the
baseline (an older stepscope cannot open a store of a newer schema), and this tree gets
a copy of it (migrated when it first opens it). The baseline must keep the runs' figures
the same way (the same ``FIGURES_VERSION``), or it computes them again at every listing.

What the issue asks of ``--help``, ``runs``, ``show last`` and ``tag``: 0.3 s wall each
on a 2-core VM; ``check`` and ``diff`` are set against the same figure. Which modules
each command imports is a test (``tests/test_cli_imports.py``), never a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "input_bound.py"
# Builds the store in a child, with the stepscope its PYTHONPATH names first (this tree's
# or the baseline's): store_scale.build imports stepscope when it runs.
BUILD = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); from store_scale import build; "
    "build(dict(os.environ), int(sys.argv[2]), steps=20, samples=10)"
)

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("runs",),
    ("runs", "--json"),
    ("show", "last"),
    ("show", "last", "--json"),
    ("tag", "--list"),
    ("tag", "last", "newest"),
    ("check", "last", "--against", "base"),
    ("diff", "base", "last"),
)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run of ``cmd``, which must exit 0 (``check``: 0 or 1)."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd[3:])}: exit {res.returncode}: {res.stderr[-2000:]!r}")
    return wall, _children_cpu() - cpu0


def build_store(env: dict[str, str], runs: int, job_steps: int) -> None:
    """``runs`` synthetic runs, then one real recorded run, in ``env``'s store and with
    ``env``'s stepscope."""
    bench = str(REPO / "bench")
    out = tempfile.gettempdir()  # not the checkout: its stepscope would come first
    subprocess.run([sys.executable, "-c", BUILD, bench, str(runs)], env=env, cwd=out, check=True)
    record = [sys.executable, "-m", "stepscope.app.cli", "run", "--name", "realistic", "--"]
    job = [sys.executable, str(JOB), "--steps", str(job_steps)]
    res = subprocess.run(
        [*record, *job], env=env, cwd=out, capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(f"the recorded run failed: {res.stderr[-2000:]}")


def _children_cpu() -> float:
    """User + system seconds of every child reaped so far."""
    t = os.times()
    return t.children_user + t.children_system


def _with_path(env: dict[str, str], first: str) -> dict[str, str]:
    """``env`` where ``import stepscope`` finds the package under ``first``."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (first, env.get("PYTHONPATH")) if p)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--baseline", metavar="DIR", help="a folder holding another stepscope")
    p.add_argument("--json", metavar="OUT", help="write the figures here as well")
    p.add_argument("--job-steps", type=int, default=40, help="steps of the recorded run")
    a = p.parse_args()

    base = Path(tempfile.mkdtemp(prefix="stepscope-cli-"))
    env0 = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_STORE"}
    roots = {"this": REPO}
    if a.baseline:
        roots["baseline"] = Path(a.baseline).resolve()
    builder = "baseline" if a.baseline else "this"  # the oldest schema: both can open it
    versions = {v: _with_path({**env0, "STEPSCOPE_HOME": str(base / v)}, str(root))
                for v, root in roots.items()}  # fmt: skip
    build_store(versions[builder], a.runs, a.job_steps)
    for version in versions:
        if version != builder:
            shutil.copytree(base / builder, base / version)
    cli = [sys.executable, "-m", "stepscope.app.cli"]
    for venv in versions.values():  # figures kept, the last run shown once, the tag
        for args in (("runs", "--json"), ("show", "last"), ("tag", str(a.runs - 1), "base")):
            subprocess.run(
                [*cli, *args], env=venv, cwd=tempfile.gettempdir(), capture_output=True, check=True
            )

    times: dict[str, dict[str, list[tuple[float, float]]]] = {v: {} for v in versions}
    for _ in range(a.reps):
        for args in COMMANDS:
            for version, venv in versions.items():
                times[version].setdefault(" ".join(args), []).append(timed([*cli, *args], venv))

    print(f"{a.runs} runs, median of {a.reps} (min-max), wall s / CPU s, whole process")
    header = "| command | " + " | ".join(f"{v} wall | {v} CPU" for v in versions) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(versions)))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for args in COMMANDS:
        name = " ".join(args)
        cells = []
        for version in versions:
            walls = [w for w, _ in times[version][name]]
            cpus = [c for _, c in times[version][name]]
            out.setdefault(name, {})[version] = {
                "wall_median_s": statistics.median(walls), "wall_min_s": min(walls),
                "wall_max_s": max(walls), "cpu_median_s": statistics.median(cpus),
            }  # fmt: skip
            cells.append(
                f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})"
                f" | {statistics.median(cpus):.2f}"
            )
        print(f"| `stepscope {name}` | " + " | ".join(cells) + " |")
    if a.json:
        figures = {"runs": a.runs, "reps": a.reps, "figures": out}
        Path(a.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
