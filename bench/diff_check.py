"""False alarms and detection of ``stepscope check`` / ``stepscope diff`` on real runs.

    python bench/diff_check.py [--repeats 20] [--steps 400] [--runs 3] [--stores DIR]
                               [--record-only | --judge-only]

Each repeat records real runs of ``bench/diff_job.py`` under ``stepscope run`` (its
default capture included) in a fresh store, after a warm-up run that is not used, in
``--runs`` interleaved rounds of four: a baseline "a", the same job again "a2", "b", the
same job with one extra matrix multiply per step (about 10 % of its step: more work,
which any machine sees), and "c", the same operators with 15 % more time per step (a
busy-wait in Python: only step times see it). Then each design of the check judges
``a2``, ``b`` and ``c`` against ``a``:

* ``one, no history``: the first round's runs, ``--runs 1``, no calibration: the
  issue's scenario (two runs, nothing else known). A time-based "slower" must be
  "inconclusive" here; only added work may fail a run;
* ``one, calibrated``: the same runs, with this host's ``stepscope calibrate --noise``
  in the store's home: intervals widened by the measured run-to-run spread;
* ``one, with history``: the last round's runs, ``--runs 1``: widened by the spread of
  the earlier runs of the same names;
* ``default``: no ``--runs`` (auto): each name's newest runs, here all ``--runs``;
* ``--runs N``: the same, asked for.

and ``stepscope diff a b`` must name ``aten::mm`` first among the operators. Goals (issue
36): no false alarm (exit 1 for a2) in 20 one against one, b detected (exit 1) 20/20,
c detected with ``--runs 3`` in at least 18/20.

Recording is the long part (13 runs per repeat), so it can be kept: ``--stores DIR``
keeps each repeat's store under DIR (a repeat already there is not recorded again), and
``--judge-only`` judges kept stores again (with the check as it is now). Every figure
and the conditions go to ``bench/results/diff_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "diff_check.json"
JOB = REPO / "bench" / "diff_job.py"
SLOWER = 0.15  # c's extra time per step
NAMES = {"a": (), "a2": (), "b": ("--extra",), "c": ("--slower", str(SLOWER))}
DESIGNS = ("one, no history", "one, calibrated", "one, with history", "default", "runs")
NOISE_RUNS = 6  # whole runs of calibrate --noise's job


def _stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)


def _record(home: Path, name: str, steps: int, *extra: str) -> None:
    job = [sys.executable, str(JOB), "--steps", str(steps), *extra]
    proc = _stepscope(home, "run", "--quiet", "--name", name, "--", *job)
    if proc.returncode != 0:
        raise SystemExit(f"recording {name} failed: {proc.stderr[-400:]}")
    newest = max(json.loads(_stepscope(home, "runs", "--json").stdout), key=lambda r: r["id"])
    if newest["steps"] != steps:  # a run the store lost steps of is no measurement
        raise SystemExit(f"recording {name}: {newest['steps']} steps stored, not {steps}")


def record(home: Path, steps: int, runs: int) -> None:
    """One repeat's store: a warm-up run, then ``runs`` interleaved rounds of every name."""
    # a first run pays for a cold machine (CPU clocks, caches, the store's creation):
    # recorded and dropped, so that A is not slower than A' and B by being first
    _record(home, "warm-up", steps)
    for _ in range(runs):  # interleaved: a slow minute hits every name alike
        for name, extra in NAMES.items():
            _record(home, name, steps, *extra)
    (home / "recorded").write_text(time.strftime("%Y-%m-%d %H:%M:%S %z") + "\n")


def _ids(home: Path) -> dict[str, list[int]]:
    """Each name's run ids, oldest first."""
    rows = json.loads(_stepscope(home, "runs", "--json").stdout)
    out: dict[str, list[int]] = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        out.setdefault(row["name"], []).append(int(row["id"]))
    return out


def _check(home: Path, run: str, base: str, *extra: str) -> dict:
    proc = _stepscope(home, "check", run, "--against", base, "--format", "json", *extra)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return {"exit": proc.returncode, "verdict": None, "why": proc.stderr.strip()[-300:]}
    fig = doc["figures"][0] if doc.get("figures") else {}
    return {
        "exit": proc.returncode,
        "verdict": doc["verdict"],
        "why": doc["why"],
        "basis": (fig.get("interval") or {}).get("basis"),
        "ratio": fig.get("speed_ratio"),
        "ci": fig.get("ci"),
        "by_added_work": doc["why"].startswith("more work per step"),
        "runs": [len(doc["baseline"]["runs"]), len(doc["run"]["runs"])],
    }


def _first_operator(home: Path) -> tuple[str | None, str | None]:
    proc = _stepscope(home, "diff", "a", "b", "--json")
    ops = [r for r in json.loads(proc.stdout)["ops"] if r["kind"] == "operator"]
    return (ops[0]["name"], ops[0]["status"]) if ops else (None, None)


def judge(home: Path, runs: int, noise_cache: Path) -> dict:
    """Every design's three checks on one repeat's store."""
    ids = _ids(home)
    first = {name: str(ids[name][0]) for name in NAMES}
    last = {name: str(ids[name][-1]) for name in NAMES}
    cache = home / noise_cache.name
    cache.unlink(missing_ok=True)
    out: dict = {}
    for design in DESIGNS:
        if design == "one, calibrated":
            shutil.copy(noise_cache, cache)
        picked = first if design.startswith("one, no") or design == "one, calibrated" else last
        extra = {"default": (), "runs": ("--runs", str(runs))}.get(design, ("--runs", "1"))
        out[design] = {
            name: _check(home, picked[name], picked["a"], *extra) for name in ("a2", "b", "c")
        }
        cache.unlink(missing_ok=True)
    out["first_operator"], out["first_status"] = _first_operator(home)
    return out


def noise_calibration(stores: Path) -> tuple[Path, dict]:
    """This host's ``stepscope calibrate --noise``, measured once for every repeat."""
    home = stores / "noise-home"
    proc = _stepscope(home, "calibrate", "--noise", "--runs", str(NOISE_RUNS), "--json")
    if proc.returncode != 0:
        raise SystemExit(f"calibrate --noise failed: {proc.stderr[-400:]}")
    doc = json.loads(proc.stdout)
    return Path(doc["cache"]), doc


def _summary(repeats: list[dict], design: str) -> dict:
    rows = [r[design] for r in repeats]
    out = {"repeats": len(rows)}
    for name in ("a2", "b", "c"):
        verdicts = [row[name]["verdict"] for row in rows]
        out[name] = {
            "failed": sum(row[name]["exit"] == 1 for row in rows),
            "by_added_work": sum(row[name]["by_added_work"] for row in rows),
            "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts), key=str)},
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=int, default=3, help="runs of each name (default 3)")
    parser.add_argument("--stores", type=Path, help="keep each repeat's store here")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--record-only", action="store_true", help="record, judge nothing")
    which.add_argument("--judge-only", action="store_true", help="judge the kept stores")
    args = parser.parse_args(argv)
    if args.judge_only and args.stores is None:
        parser.error("--judge-only needs --stores")
    stores = args.stores or Path(tempfile.mkdtemp(prefix="diffcheck-"))
    stores.mkdir(parents=True, exist_ok=True)
    homes = [stores / f"repeat-{i + 1:02d}" for i in range(args.repeats)]
    began = time.strftime("%Y-%m-%d %H:%M:%S %z")
    if not args.judge_only:
        for i, home in enumerate(homes):
            if not (home / "recorded").exists():
                shutil.rmtree(home, ignore_errors=True)
                record(home, args.steps, args.runs)
            print(f"recorded repeat {i + 1} ({os.getloadavg()[0]:.2f} load)", file=sys.stderr)
    if args.record_only:
        return 0
    noise_cache, noise = noise_calibration(stores)
    print(f"calibrate --noise: {noise}", file=sys.stderr)
    repeats = []
    for i, home in enumerate(homes):
        repeats.append(judge(home, args.runs, noise_cache))
        print(f"repeat {i + 1}: {json.dumps(repeats[-1])}", file=sys.stderr)
    n = len(repeats)
    summary = {design: _summary(repeats, design) for design in DESIGNS}
    summary["named_first"] = sum(
        (r["first_operator"] or "").startswith("aten::mm") for r in repeats
    )
    for design in DESIGNS:
        d = summary[design]
        print(
            f"{design}: a2 failed {d['a2']['failed']}/{n} {d['a2']['verdicts']}; "
            f"b failed {d['b']['failed']}/{n} ({d['b']['by_added_work']} by added work); "
            f"c failed {d['c']['failed']}/{n} {d['c']['verdicts']}"
        )
    print(f"diff: aten::mm named first in {summary['named_first']}/{n}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "conditions": {
            "recorded_from": began,
            "judged": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "steps": args.steps,
            "runs": args.runs,
            "slower": SLOWER,
            "noise_calibration": noise,
            "stores": str(stores),
        },
        "summary": summary,
        "repeats": repeats,
    }
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
