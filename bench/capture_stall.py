"""How long the default capture holds the job's own loop: `stepscope run` with its default
capture against `--no-profile`, by the job's own clock (its ``loop_s``), paired in rounds.

    python bench/capture_stall.py                     # the LBFGS corpus job, 3 rounds
    python bench/capture_stall.py --rounds 5 --json-out /tmp/capture_stall.json

The job is ``examples/corpus/time_sequence_lbfgs.py --steps 6 --length 60``: steps of about
2 s made of thousands of tiny operators, whose one-step trace is about 150 MiB of JSON.
What the capture may cost the loop is its profiled step's own slowdown and the export;
since the export's compression moved off the job's thread (``capture/trace_writer.py``)
only torch's own stop and write stay on it. Each round runs both arms in a rotated order;
the figures are each arm's median loop time and the median of the per-round differences.
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

REPO = Path(__file__).resolve().parents[1]
JOB = ["examples/corpus/time_sequence_lbfgs.py", "--steps", "6", "--length", "60"]
ARMS = {"no_profile": ["--no-profile", "--quiet"], "capture": ["--quiet"]}


def loop_time(repo: Path, home: Path, options: list[str]) -> float:
    """The job's own loop time (s) under `stepscope run` from ``repo``'s checkout."""
    command = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", *options]
    command += ["--", sys.executable, str(REPO / JOB[0]), *JOB[1:]]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=_env(repo))
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("CORPUS "))
    return float(json.loads(line.removeprefix("CORPUS "))["loop_s"])


def _env(repo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(repo)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO, help="the stepscope checkout to time")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                took = loop_time(args.repo, Path(tmp) / arm, ARMS[arm])
                times[arm].append(took)
                print(f"round {r + 1} {arm}: loop {took:.2f} s", flush=True)
    diffs = [c - n for c, n in zip(times["capture"], times["no_profile"], strict=True)]
    out = {
        "job": " ".join(JOB),
        "repo": str(args.repo),
        "loop_s": {arm: statistics.median(v) for arm, v in times.items()},
        "added_s_median": statistics.median(diffs),
        "added_s": diffs,
        "rounds": times,
    }
    print(json.dumps(out, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
