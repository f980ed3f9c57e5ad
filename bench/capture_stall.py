"""How long the default capture holds the job's own loop: `stepscope run` with its default
capture against `--no-profile`, by the job's own clock (its ``loop_s``), paired in rounds.

    python bench/capture_stall.py                     # the LBFGS corpus job, 3 rounds
    python bench/capture_stall.py --job host_overhead --rounds 5
    python bench/capture_stall.py --rounds 5 --json-out /tmp/capture_stall.json

The jobs (``JOBS``): ``lbfgs``, ``examples/corpus/time_sequence_lbfgs.py --steps 6 --length
60``: steps of about 2 s made of thousands of tiny operators, whose one-step trace is about
150 MiB of JSON; and issue 41's two, ``host_overhead`` (600 host-bound steps of ~20 ms) and
``dense_compute`` (30 compute-bound steps), timed by their own ``--timings-out``.
What the capture may cost the loop is its profiled step's own slowdown and the export;
since the export's compression moved off the job's thread (``capture/trace_writer.py``)
only torch's own stop and write stay on it. Each round runs both arms in a rotated order;
the figures are each arm's median loop time and the median of the per-round differences.

The added time is then taken apart, per round: what closing the window held the job's
thread (torch's stop and its writing of the trace, which the capture measures and keeps
in the trace's row, ``held_s``), and the captured steps' own slowdown (their times
against the same steps of the run without a capture). The issue's goal reads: the loop
with the capture within 5 % of the loop without it, plus the profiled steps' own time;
``goal_slack_s`` is 1.05 x bare + the captured steps' time - the loop with the capture
(positive: met).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: name -> the job's command line (from the repository's root); a job of ``examples/``
#: is timed by its ``--timings-out`` (the sum of its iterations), a corpus job by the
#: ``loop_s`` of its ``CORPUS`` line
JOBS = {
    "lbfgs": ["examples/corpus/time_sequence_lbfgs.py", "--steps", "6", "--length", "60"],
    "host_overhead": ["examples/host_overhead.py", "--steps", "600"],
    "dense_compute": ["examples/dense_compute.py", "--steps", "30"],
}
ARMS = {"no_profile": ["--no-profile", "--quiet"], "capture": ["--quiet"]}


def loop_time(repo: Path, home: Path, job: list[str], options: list[str]) -> float:
    """The job's own loop time (s) under `stepscope run` from ``repo``'s checkout."""
    timings = home.with_suffix(".timings.json")
    command = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", *options]
    command += ["--", sys.executable, str(REPO / job[0]), *job[1:]]
    corpus = "/corpus/" in job[0]
    if not corpus:
        command += ["--timings-out", str(timings)]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=_env(repo))
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if not corpus:
        return float(sum(json.loads(timings.read_text())["iteration_s"]))
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("CORPUS "))
    return float(json.loads(line.removeprefix("CORPUS "))["loop_s"])


def last_run(repo: Path, home: Path) -> dict[str, Any]:
    """The last run's step times, the time from the job's start (its process's) to the
    end of its first step, and its trace's meta (first step, steps, ``held_s``), read
    from its store by ``repo``'s own stepscope (its schema)."""
    code = (
        "import json, sys\n"
        "from stepscope.store import RunStore\n"
        "with RunStore(sys.argv[1]) as s:\n"
        "    run = s.resolve_run('last')\n"
        "    steps = s.steps(run)\n"
        "    arts = s.artifacts(run)\n"
        "    row = s.run(run)\n"
        "traces = arts[arts['kind'] == 'trace']\n"
        "began = row.get('pid_started_at') or row['started_at']\n"
        "print(json.dumps({'step_s': (steps['end_s'] - steps['start_s']).tolist(),\n"
        "                  'first_step_s': float(steps['end_s'].min() - began),\n"
        "                  'trace': traces['meta'].iloc[0] if len(traces) else None}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(home)], capture_output=True, text=True, env=_env(repo)
    )
    if proc.returncode != 0:
        sys.exit(f"bench: reading {home} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def taken_apart(bare: dict[str, Any], captured: dict[str, Any], added: float) -> dict[str, Any]:
    """One round's added time in its parts: closing the window (torch's stop and write),
    the captured steps' own slowdown, and what neither explains."""
    meta = captured["trace"] or {}
    first, count = int(meta.get("first_step", 0)), int(meta.get("steps", 0))
    window = slice(first, first + count)
    own_s = sum(captured["step_s"][window])
    slowdown_s = own_s - sum(bare["step_s"][window])
    held = meta.get("held_s") or {}  # absent from a checkout before the capture kept it
    held_s = sum(held.values()) if held else None
    return {
        "captured_steps": [first, first + count - 1],
        "captured_steps_s": own_s,
        "steps_slowdown_s": slowdown_s,
        "held_s": held or None,
        "rest_s": None if held_s is None else added - held_s - slowdown_s,
    }


def _env(repo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(repo)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="lbfgs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO, help="the stepscope checkout to time")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    first: dict[str, list[float]] = {arm: [] for arm in ARMS}
    parts: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            runs = {}
            for arm in order:
                home = Path(tmp) / f"{arm}{r}"
                took = loop_time(args.repo, home, JOBS[args.job], ARMS[arm])
                times[arm].append(took)
                runs[arm] = last_run(args.repo, home)
                first[arm].append(runs[arm]["first_step_s"])
                print(f"round {r + 1} {arm}: loop {took:.2f} s", flush=True)
            added = times["capture"][-1] - times["no_profile"][-1]
            part = taken_apart(runs["no_profile"], runs["capture"], added)
            part["goal_slack_s"] = (
                1.05 * times["no_profile"][-1] + part["captured_steps_s"] - times["capture"][-1]
            )
            parts.append(part)
            print(f"round {r + 1}: added {added:+.2f} s, {json.dumps(part)}", flush=True)
    diffs = [c - n for c, n in zip(times["capture"], times["no_profile"], strict=True)]
    out = {
        "job": " ".join(JOBS[args.job]),
        "repo": str(args.repo),
        "loop_s": {arm: statistics.median(v) for arm, v in times.items()},
        "added_s_median": statistics.median(diffs),
        "added_s": diffs,
        "first_step_s": {arm: statistics.median(v) for arm, v in first.items()},
        "rounds": times,
        "taken_apart": parts,
    }
    print(json.dumps(out, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
