"""Write throughput of the run store: steps/s on SQLite and on PostgreSQL, side by side.

    python bench/store_write.py [--seconds 5] [--writers 1,8] [--json OUT]

Each writer is its own process with its own run, as the ranks of jobs writing to one
store are. Two ways of writing, both measured on both backends in one invocation:

* **batched**: transactions of 1000 steps (``RunStore.add_steps``), back to back: what
  ``BufferedWriter``'s flush does once a second, without the second in between. The
  figure is the ceiling of steps/s the store absorbs from writers that batch as jobs
  do (a training loop makes 1 to a few hundred steps/s; the writer's other rows,
  samples and events, are fewer). Includes building the rows in Python.
* **row**: one transaction per step (``RunStore.add_steps`` with one row), the worst
  case of a collector that committed each row itself. Figure: commits/s.

The PostgreSQL server is a throwaway cluster on 127.0.0.1 (Debian's binaries, started
here with ``tests/pg_server.py``) at its default durability (fsync and synchronous
commit on); SQLite is the default store file (WAL, synchronous=NORMAL) on local disk.
So each backend runs with its shipped settings: SQLite's NORMAL does not fsync each
commit, PostgreSQL's default does. Figures are medians of ``--reps`` runs; every cell
of a rep runs before the next rep starts, so machine load hits all cells alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH = 1000  # steps per transaction in "batched": a flush of a fast job's second
sys.path.insert(0, str(REPO / "tests"))  # pg_server.py: the tests' real server


def worker(home: str, run_id: int, mode: str, seconds: float, start_at: float) -> None:
    """One writer; prints its JSON result line."""
    from stepscope.store import RunStore

    batch = BATCH if mode == "batched" else 1
    step = 0
    with RunStore(home) as store:
        store.add_steps(run_id, [])  # imports done, connection made: as a running job's
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            now = time.time()
            rows = [
                {"step": step + i, "start_s": now, "end_s": now, "loss": 0.5,
                 "data_wait_s": 0.001, "forward_s": 0.01, "backward_s": 0.02}
                for i in range(batch)
            ]  # fmt: skip
            store.add_steps(run_id, rows)
            step += batch
        elapsed = time.perf_counter() - t0
        written = len(store.steps(run_id))
    print(json.dumps({"steps": step, "written": written, "seconds": elapsed}))


def cell(backend_url: str | None, mode: str, writers: int, seconds: float) -> dict:
    """One measurement: ``writers`` processes at once; steps/s over all of them."""
    from stepscope.store import RunStore

    home = tempfile.mkdtemp(prefix="stepscope-bench-")
    env = {**os.environ, "STEPSCOPE_HOME": home}
    env.pop("STEPSCOPE_STORE", None)
    if backend_url:
        env["STEPSCOPE_STORE"] = backend_url
    with RunStore(home, url=backend_url) as store:
        runs = [store.create_run(["bench"], name=f"w{i}") for i in range(writers)]
    start_at = time.time() + 1.5 + 0.2 * writers  # after every process has imported
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                home,
                str(r),
                mode,
                str(seconds),
                repr(start_at),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )  # fmt: skip
        for r in runs
    ]
    results = [json.loads(p.communicate(timeout=seconds * 10 + 120)[0]) for p in procs]
    assert all(r["written"] == r["steps"] for r in results), results  # nothing lost
    total = sum(r["written"] for r in results)
    wall = max(r["seconds"] for r in results)
    return {"steps_per_s": total / wall, "steps": total}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        home, run_id, mode, seconds, start_at = sys.argv[2:7]
        worker(home, int(run_id), mode, float(seconds), float(start_at))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", default="1,8")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from pg_server import PgServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL server binaries not found (apt-get install postgresql)")
    server = PgServer(bindir, fsync=True).start()
    try:
        backends = {"sqlite": None, "postgresql": server.create_database()}
        cells = [
            (b, m, int(w))
            for m in ("batched", "row")
            for w in args.writers.split(",")
            for b in backends
        ]
        figures: dict[tuple, list[float]] = {c: [] for c in cells}
        for _ in range(args.reps):
            for backend, mode, writers in cells:
                res = cell(backends[backend], mode, writers, args.seconds)
                figures[(backend, mode, writers)].append(res["steps_per_s"])
    finally:
        server.stop()
    print(f"store write throughput, steps/s (median of {args.reps}; {args.seconds:g} s per "
          f"writer; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{platform.python_version()})")  # fmt: skip
    print(f"{'mode':<8} {'writers':>7} {'sqlite':>10} {'postgresql':>11} {'pg/sqlite':>9}")
    rows = []
    for mode in ("batched", "row"):
        for w in args.writers.split(","):
            lite = statistics.median(figures[("sqlite", mode, int(w))])
            pg = statistics.median(figures[("postgresql", mode, int(w))])
            print(f"{mode:<8} {w:>7} {lite:>10.0f} {pg:>11.0f} {pg / lite:>9.2f}")
            rows.append({"mode": mode, "writers": int(w), "sqlite": lite, "postgresql": pg})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
