"""False alarms and detection of ``stepscope check`` / ``stepscope diff`` on real runs.

    python bench/diff_check.py [--repeats 20] [--steps 400] [--runs 3]

Each repeat records real runs of ``bench/diff_job.py`` under ``stepscope run`` (its
default capture included) in a fresh store, after a warm-up run that is not used, in
``--runs`` interleaved rounds of three: a baseline "a", the same job again "a2", and
"b", the same job with one extra matrix multiply per step (about 10 % of its step
time). Then, for two designs of the check:

* one run against one (the newest of each name): ``check a2 --against a`` must pass
  (exit 0) and ``check b --against a`` must fail (exit 1);
* ``--runs N``: the same over the N runs of each name (intervals over runs);

and ``stepscope diff a b`` must name ``aten::mm`` first among the operators. Goals: at
most 1 false alarm in 20 (under 5 %), at least 19 detections in 20, naming the operator
first. Every figure and the conditions go to ``bench/results/diff_check.json``.
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


def _check(home: Path, run: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _stepscope(home, "check", run, "--against", "a", *extra)


def repeat(steps: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="diffcheck-") as tmp:
        home = Path(tmp) / "home"
        # a first run pays for a cold machine (CPU clocks, caches, the store's creation):
        # recorded and dropped, so that A is not slower than A' and B by being first
        _record(home, "warm-up", steps)
        for _ in range(runs):  # interleaved: a slow minute hits every name alike
            for name, extra in (("a", ()), ("a2", ()), ("b", ("--extra",))):
                _record(home, name, steps, *extra)
        out: dict = {}
        for design, extra in (("one", ()), ("runs", ("--runs", str(runs)))):
            same, slower = _check(home, "a2", *extra), _check(home, "b", *extra)
            out[design] = {
                "same_exit": same.returncode,
                "slower_exit": slower.returncode,
                "same_out": same.stdout.strip().splitlines()[:2],
                "slower_out": slower.stdout.strip().splitlines()[:2],
            }
        out["first_operator"], out["first_status"] = _first_operator(home)
    return out


def _summary(runs: list[dict], design: str) -> dict:
    n = len(runs)
    false_alarms = sum(r[design]["same_exit"] != 0 for r in runs)
    detected = sum(r[design]["slower_exit"] == 1 for r in runs)
    return {
        "false_alarms": false_alarms,
        "detected": detected,
        "repeats": n,
        "goals_met": {
            "false alarms <= 1 in 20": false_alarms <= n / 20,
            "detected >= 19 in 20": detected >= n * 19 / 20,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=int, default=3, help="runs of each name (default 3)")
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.repeats):
        r = repeat(args.steps, args.runs)
        runs.append(r)
        print(f"repeat {i + 1}: {r}", file=sys.stderr)
    n = len(runs)
    named = sum((r["first_operator"] or "").startswith("aten::mm") for r in runs)
    summary = {design: _summary(runs, design) for design in ("one", "runs")}
    summary["named_first"] = named
    for design, label in (("one", "one run each"), ("runs", f"{args.runs} runs each")):
        d = summary[design]
        print(
            f"{label}: same job {n - d['false_alarms']}/{n} passed ({d['false_alarms']} false "
            f"alarms); +1 matmul {d['detected']}/{n} flagged slower"
        )
    print(f"diff: aten::mm named first in {named}/{n}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "steps": args.steps,
            "runs": args.runs,
        },
        "summary": summary,
        "runs": runs,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
