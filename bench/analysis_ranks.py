"""A multi-rank job's traces analysed by one worker against one worker per core.

    python bench/analysis_ranks.py [--ranks 16] [--events 250000] [--reps 3]

Writes (once, cached in ``$TMPDIR/stepscope_bench/ranks_R_E/``) ``--ranks`` synthetic
traces of about ``--events`` events each (``bench/synthetic_trace.py --rank i``: about
50 MB of JSON per rank at the default), then times the real console script,
``stepscope analyze FOLDER --json --workers N > /dev/null``, as whole fresh processes:
``--workers 1`` (every rank in one process, one after another) against the default
(one worker per core). Repetitions are interleaved (1, all, 1, all, ...) so load from
other jobs hits both alike; it prints the medians and their ratio. The two reports must
be equal (minus timings): the bench checks it once.
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
BENCH_DIR = Path(tempfile.gettempdir()) / "stepscope_bench"
RESULTS = REPO / "bench" / "results" / "analysis_ranks.json"


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("stepscope")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stepscope.app.cli"]


def traces(ranks: int, events: int) -> Path:
    """The synthetic job's folder, one ``rank-i.json.gz`` per rank (written once)."""
    folder = BENCH_DIR / f"ranks_{ranks}_{events}"
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        path = folder / f"rank-{rank:03d}.json.gz"
        if path.exists():
            continue
        tmp = path.with_name(path.name + ".part.json.gz")
        gen = [sys.executable, str(REPO / "bench" / "synthetic_trace.py"), str(tmp)]
        gen += ["--events", str(events), "--rank", str(rank), "--seed", str(rank)]
        subprocess.run(gen, check=True)
        tmp.rename(path)
    return folder


def measure(folder: Path, workers: int | None, out: Path | None = None) -> dict:
    """One whole ``stepscope analyze`` process: its wall seconds."""
    cmd = [*_cli(), "analyze", str(folder), "--json"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    with open(out or os.devnull, "wb") as sink:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.PIPE, check=False)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.decode()[-400:]}")
    return {"wall_s": wall}


def _same_reports(a: Path, b: Path) -> bool:
    left, right = json.loads(a.read_bytes()), json.loads(b.read_bytes())
    for doc in (left, right):
        doc.pop("timings_s", None)
    return left == right


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--events", type=int, default=250_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    folder = traces(args.ranks, args.events)
    size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
    # gzip's trailer holds the uncompressed size (mod 4 GiB: ample for one rank)
    raw_mb = sum(int.from_bytes(p.read_bytes()[-4:], "little") for p in folder.iterdir()) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one.json", Path(tmp) / "many.json"
        measure(folder, 1, one)
        measure(folder, None, many)
        same = _same_reports(one, many)
    runs: dict[str, list[dict]] = {"1 worker": [], "one per core": []}
    for rep in range(args.reps):
        for label, workers in (("1 worker", 1), ("one per core", None)):
            r = measure(folder, workers)
            runs[label].append(r)
            print(f"rep {rep + 1} {label:12s} {r}", file=sys.stderr)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    result = {
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "ranks": args.ranks,
            "events_per_rank": args.events,
            "gzip_mb": size_mb,
            "json_mb": raw_mb,
        },
        "reports_equal": same,
        "median_wall_s": med,
        "speedup": med["1 worker"] / med["one per core"],
        "runs": runs,
    }
    print(
        f"{args.ranks} ranks x ~{args.events} events ({raw_mb / args.ranks:.0f} MB JSON each), "
        f"{os.cpu_count()} cores: 1 worker {med['1 worker']:.2f} s, one per core "
        f"{med['one per core']:.2f} s, {result['speedup']:.2f}x; reports equal: {same}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
