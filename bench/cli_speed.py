"""The everyday CLI commands as whole processes, on a store of 1,000 runs (issue 41).

    python bench/cli_speed.py [--runs 1000] [--reps 7] [--baseline DIR] [--json OUT]

Builds a SQLite store of ``--runs`` finished runs (``store_scale.build``: 20 steps and 10
samples each, one run in ten diagnosed), tags its second newest run ``base``, and lists
it once (``stepscope runs --json``: the runs' figures are computed and kept, as after
any first listing; not timed). Then times each command below as a whole process
(interpreter start, imports, the queries, the output written to a pipe): the wall
seconds and the CPU seconds of the process, the median of ``--reps`` runs. The reps
interleave (rep 1 of every command, then rep 2), so load from other work on the
machine hits them alike; a wide min-max says it was noisy.

``--baseline DIR`` times another version of stepscope in the same reps, on the same
store: DIR holds its ``stepscope`` package (``git archive REV stepscope | tar -x -C
DIR``), put first on PYTHONPATH. It must keep the runs' figures the same way (the same
``FIGURES_VERSION``), or each version computes them again at every listing.

What the issue asks of ``--help``, ``runs``, ``show last`` and ``tag``: 0.3 s wall each
on a 2-core VM. Which modules each command imports is a test (``tests/test_cli_imports.py``),
never a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # this tree's stepscope; store_scale.py

from store_scale import build  # noqa: E402  (a script of this folder, not a package)

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("runs",),
    ("runs", "--json"),
    ("show", "last"),
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
    a = p.parse_args()

    home = Path(tempfile.mkdtemp(prefix="stepscope-cli-")) / "home"
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_STORE"}
    env["STEPSCOPE_HOME"] = str(home)
    build(env, a.runs, steps=20, samples=10)
    versions = {"this": _with_path(env, str(REPO))}
    if a.baseline:
        versions["baseline"] = _with_path(env, str(Path(a.baseline).resolve()))
    cli = [sys.executable, "-m", "stepscope.app.cli"]
    for venv in versions.values():  # figures kept, and the tag the check reads
        subprocess.run([*cli, "runs", "--json"], env=venv, capture_output=True, check=True)
        tag = [*cli, "tag", str(a.runs - 1), "base"]
        subprocess.run(tag, env=venv, capture_output=True, check=True)

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
