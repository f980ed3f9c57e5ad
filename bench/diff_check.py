"""False alarms and detection of ``stepscope check`` / ``stepscope diff`` on real runs.

    python bench/diff_check.py [--repeats 20] [--steps 400]

Each repeat records three real runs of ``bench/diff_job.py`` under ``stepscope run`` (its
default capture included) in a fresh store, after a warm-up run that is not used: a
baseline A, the same job again A', and B,
the same job with one extra matrix multiply per step (about 10 % of its step time).
Then ``stepscope check A' --against A`` must pass (exit 0: no measurable slowdown beyond
the default 5 %) and ``stepscope check B --against A`` must fail (exit 1), and
``stepscope diff A B`` must name ``aten::mm`` first among the operators. Goals: at most 1
false alarm in 20 (under 5 %), at least 19 detections in 20, naming the operator first.
The runs of a repeat are recorded back to back, so load from other jobs hits them alike;
every figure and the conditions go to ``bench/results/diff_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "diff_check.json"
JOB = REPO / "bench" / "diff_job.py"


def _stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


def _record(home: Path, name: str, steps: int, *extra: str) -> None:
    job = [sys.executable, str(JOB), "--steps", str(steps), *extra]
    proc = _stepscope(home, "run", "--quiet", "--name", name, "--", *job)
    if proc.returncode != 0:
        raise SystemExit(f"recording {name} failed: {proc.stderr[-400:]}")


def _first_operator(home: Path) -> tuple[str | None, str | None]:
    proc = _stepscope(home, "diff", "a", "b", "--json")
    ops = [r for r in json.loads(proc.stdout)["ops"] if r["kind"] == "operator"]
    return (ops[0]["name"], ops[0]["status"]) if ops else (None, None)


def repeat(steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="diffcheck-") as tmp:
        home = Path(tmp) / "home"
        # a first run pays for a cold machine (CPU clocks, caches, the store's creation):
        # recorded and dropped, so that A is not slower than A' and B by being first
        for name, extra in (("warm-up", ()), ("a", ()), ("a2", ()), ("b", ("--extra",))):
            _record(home, name, steps, *extra)
        same = _stepscope(home, "check", "a2", "--against", "a")
        slower = _stepscope(home, "check", "b", "--against", "a")
        name, status = _first_operator(home)
    return {
        "same_exit": same.returncode,
        "slower_exit": slower.returncode,
        "first_operator": name,
        "first_status": status,
        "same_out": same.stdout.strip().splitlines()[:2],
        "slower_out": slower.stdout.strip().splitlines()[:2],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.repeats):
        r = repeat(args.steps)
        runs.append(r)
        print(f"repeat {i + 1}: {r}", file=sys.stderr)
    false_alarms = sum(r["same_exit"] != 0 for r in runs)
    detected = sum(r["slower_exit"] == 1 for r in runs)
    named = sum(r["first_operator"] == "aten::mm" for r in runs)
    n = len(runs)
    summary = {
        "false_alarms": false_alarms,
        "detected": detected,
        "named_first": named,
        "repeats": n,
        "goals_met": {
            "false alarms <= 1 in 20": false_alarms <= n / 20,
            "detected >= 19 in 20": detected >= n * 19 / 20,
            "aten::mm named first >= 19 in 20": named >= n * 19 / 20,
        },
    }
    print(
        f"same job: {n - false_alarms}/{n} passed ({false_alarms} false alarms); "
        f"+1 matmul: {detected}/{n} flagged slower, aten::mm named first in {named}/{n}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "steps": args.steps,
        },
        "summary": summary,
        "runs": runs,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
