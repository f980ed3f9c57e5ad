"""`stepscope runs` and the dashboard's Runs page over a store of 10,000 runs.

    python bench/store_scale.py [--runs 10000] [--steps 20] [--samples 10] [--reps 3]
                                [--no-pg] [--profile] [--baseline DIR] [--json OUT]

Builds a store of ``--runs`` finished runs, each with ``--steps`` steps and ``--samples``
samples and one run in ten diagnosed (a top finding), on SQLite and, when the server's
binaries are installed, on a throwaway PostgreSQL on 127.0.0.1 (``tests/pg_server.py``).
Then, on each backend, times:

* **first**: the first listing after the store was built (``stepscope runs --json``): no
  run has its figures kept yet (a store recorded before they were), so it computes and
  keeps them all, once;
* **cli**: ``stepscope runs`` as a whole process (interpreter start, imports, the
  queries, the table printed to a pipe: its newest 50 rows), and **json**: ``stepscope
  runs --json`` (every run);
* **page**: the Runs page (``app/dashboard/main.py``, whose default page it is) run by
  Streamlit's ``AppTest`` in a fresh process: the first run (cold caches: what a user who
  opens the dashboard waits for) and a second run in the same session (what every rerun
  costs: a filter changed, the table's refresh while a job runs).

Every figure is the median of ``--reps`` fresh processes; the reps interleave (rep 1 of
every measurement, then rep 2), so machine load hits them alike. ``--baseline DIR``
times another version of stepscope side by side on the same stores, in the same reps:
DIR holds its ``stepscope`` package (a copy of an older tree of the same schema
version), put first on PYTHONPATH; its ``runs --json`` must print what this tree's
prints (the figures to the last digit) and its Runs page the same figures.
``--profile`` adds a cProfile of one cold page run and one CLI run per backend: the top
functions by cumulative time, to say where the time goes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "stepscope" / "app" / "dashboard" / "main.py"
FIGURES = ["id", "median step (ms)", "samples/s", "data wait (%)"]  # the Runs page's
PAGE_TIMEOUT_S = 600
sys.path.insert(0, str(REPO / "tests"))  # pg_server.py: the tests' real server


def build(env: dict[str, str], runs: int, steps: int, samples: int) -> None:
    """The store: finished runs with steps and samples, one in ten with a finding."""
    from stepscope.store import RunStore
    from stepscope.types import Finding

    finding = Finding.from_json(
        {"class": "io", "subtype": "input_pipeline", "title": "the job waits for data",
         "share": 0.4, "confidence": 0.9, "evidence": [{"text": "data wait 40 %"}],
         "fixes": [{"id": "dataloader_workers"}], "level": "steps"}
    )  # fmt: skip
    t0 = 1_790_000_000.0
    with RunStore(env["STEPSCOPE_HOME"], url=env.get("STEPSCOPE_STORE")) as store:
        store._db.execute(
            "INSERT INTO runs(name, command, cwd, status, exit_code, started_at, ended_at,"
            ' host, "user", env, config) VALUES (:name, :command, :cwd, :status, 0, :start,'
            " :end, :host, :user, '{}', '{}')",
            [
                {"name": f"train-{i % 50}", "command": json.dumps(["python", f"train{i}.py"]),
                 "cwd": "/work", "status": "completed", "start": t0 + i * 60,
                 "end": t0 + i * 60 + 30, "host": f"node-{i % 8}", "user": f"user{i % 5}"}
                for i in range(runs)
            ],
        )  # fmt: skip
        ids = [int(r["id"]) for r in store._db.rows("SELECT id FROM runs ORDER BY id")]
        for run_id in ids:
            start = t0 + run_id * 60
            store.add_steps(
                run_id,
                [{"step": s, "start_s": start + s * 0.1, "end_s": start + s * 0.1 + 0.09,
                  "data_wait_s": 0.02, "batch_size": 32, "loss": 1.0 / (s + 1)}
                 for s in range(steps)],
            )  # fmt: skip
            store.add_samples(
                run_id, [(start + k * 0.5, "proc", "cpu_percent", 90.0) for k in range(samples)]
            )
            if run_id % 10 == 0:
                store.save_findings(run_id, [finding])


def child_page(entry: str) -> None:
    """One fresh process: the Runs page cold, then again; prints seconds as JSON."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(entry, default_timeout=PAGE_TIMEOUT_S)
    t0 = time.perf_counter()
    at.run()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    at.run()
    warm = time.perf_counter() - t0
    problems = [e.value for e in at.exception] + [e.value for e in at.error]
    table = at.dataframe[0].value if at.dataframe else None
    rows = 0 if table is None else len(table)
    # the figures as shown, to the last digit: the baseline's page must show the same
    shown = "" if table is None else repr(table[FIGURES].values.tolist())
    digest = hashlib.sha256(shown.encode()).hexdigest()
    print(json.dumps({"cold": cold, "warm": warm, "rows": rows, "figures": digest,
                      "problems": problems}))  # fmt: skip


def child_table(profile: str) -> None:
    """The page's data, ``data.runs_table``, cold, under cProfile: AppTest runs the page's
    script on a thread of its own, which a profile of the caller's thread never sees."""
    import cProfile

    from stepscope.app.dashboard import data

    profiler = cProfile.Profile()
    profiler.runcall(data.runs_table, data.store_home())
    profiler.dump_stats(profile)


def time_cli(env: dict[str, str], *args: str) -> tuple[float, str]:
    """Seconds of ``stepscope runs ARGS`` as a whole process, and what it printed."""
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "runs", *args],
        env=env, capture_output=True, check=False, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"stepscope runs {' '.join(args)}: {res.stderr.decode()[-2000:]}")
    return took, res.stdout.decode()


def with_baseline(env: dict[str, str], baseline: str) -> dict[str, str]:
    """``env`` where ``import stepscope`` finds the baseline's package first."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (baseline, env.get("PYTHONPATH")) if p)}


def time_page(env: dict[str, str], root: Path = REPO) -> dict[str, Any]:
    """The Runs page of the stepscope under ``root`` (this tree, or the baseline's)."""
    cmd = [sys.executable, __file__, "--child-page", str(root / ENTRY.relative_to(REPO))]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"page: {res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if out["problems"]:
        raise RuntimeError(f"the Runs page failed: {out['problems']}")
    return out


def profile_top(path: str, n: int = 14) -> str:
    """The functions with the most cumulative time, as pstats prints them."""
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(path, stream=buf).sort_stats("cumulative").print_stats(n)
    return buf.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=20, help="steps per run")
    p.add_argument("--samples", type=int, default=10, help="samples per run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-pg", action="store_true", help="SQLite only")
    p.add_argument("--profile", action="store_true", help="cProfile the page's data, the CLI")
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "store_scale.json"))
    p.add_argument(
        "--baseline", metavar="DIR", help="a folder holding another stepscope package, to time"
    )
    p.add_argument("--child-page", metavar="ENTRY", help=argparse.SUPPRESS)
    p.add_argument("--profile-to", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child_page:
        child_page(a.child_page)
        return 0
    if a.profile_to:
        child_table(a.profile_to)
        return 0

    from pg_server import PgServer, find_bindir

    base = Path(tempfile.mkdtemp(prefix="stepscope-scale-"))
    env0 = {k: v for k, v in os.environ.items() if k not in ("STEPSCOPE_STORE",)}
    backends: dict[str, dict[str, str]] = {
        "sqlite": {**env0, "STEPSCOPE_HOME": str(base / "sqlite")},
    }
    server = None
    bindir = None if a.no_pg else find_bindir()
    if bindir is not None:
        server = PgServer(bindir).start()
        backends["postgresql"] = {
            **env0, "STEPSCOPE_HOME": str(base / "pg"), "STEPSCOPE_STORE": server.create_database()
        }  # fmt: skip
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
        "load_before": os.getloadavg(),
        "runs": a.runs, "steps_per_run": a.steps, "samples_per_run": a.samples,
        "backends": {},
    }  # fmt: skip
    old = None if a.baseline is None else Path(a.baseline).resolve()
    try:
        for name, env in backends.items():
            t0 = time.perf_counter()
            build(env, a.runs, a.steps, a.samples)
            print(f"{name}: built {a.runs} runs in {time.perf_counter() - t0:.0f} s", flush=True)
            got = results["backends"][name] = {"cli": [], "json": [], "page_cold": [],
                                               "page_warm": []}  # fmt: skip
            first, listed = time_cli(env, "--json")  # computes and keeps every run's figures
            got["first"] = [first]
            print(f"{name}: first list (figures of {a.runs} runs kept) {first:.1f} s", flush=True)
            if old is not None:
                took, old_listed = time_cli(with_baseline(env, str(old)), "--json")
                got["baseline_json"] = [took]
                assert old_listed == listed, f"{name}: runs --json differs from the baseline's"
                print(f"{name}: baseline runs --json {took:.1f} s, the same output", flush=True)
                got.update(baseline_cli=[], baseline_page_cold=[], baseline_page_warm=[])
        for rep in range(a.reps):
            for name, env in backends.items():
                got = results["backends"][name]
                got["cli"].append(time_cli(env)[0])
                got["json"].append(time_cli(env, "--json")[0])
                page = time_page(env)
                assert page["rows"] == a.runs, page
                got["page_cold"].append(page["cold"])
                got["page_warm"].append(page["warm"])
                print(f"rep {rep + 1} {name}: cli {got['cli'][-1]:.2f} s, --json"
                      f" {got['json'][-1]:.2f} s, page cold {page['cold']:.2f} s, rerun"
                      f" {page['warm']:.2f} s", flush=True)  # fmt: skip
                if old is None:
                    continue
                got["baseline_cli"].append(time_cli(with_baseline(env, str(old)))[0])
                before = time_page(with_baseline(env, str(old)), old)
                assert before["rows"] == a.runs, before
                assert before["figures"] == page["figures"], f"{name}: the page's figures differ"
                got["baseline_page_cold"].append(before["cold"])
                got["baseline_page_warm"].append(before["warm"])
                print(f"rep {rep + 1} {name} baseline: cli {got['baseline_cli'][-1]:.2f} s,"
                      f" page cold {before['cold']:.2f} s, rerun {before['warm']:.2f} s"
                      " (the same figures)", flush=True)  # fmt: skip
        if a.profile:
            for name, env in backends.items():
                prof = str(base / f"page_{name}.prof")
                cmd = [sys.executable, __file__, "--profile-to", prof]
                subprocess.run(cmd, env=env, capture_output=True, check=True)
                print(f"\n== {name}: the Runs page's data (runs_table), cold ==")
                print(profile_top(prof))
                cli_prof = str(base / f"cli_{name}.prof")
                subprocess.run(
                    [sys.executable, "-m", "cProfile", "-o", cli_prof, "-m", "stepscope.app.cli",
                     "runs"], env=env, stdout=subprocess.DEVNULL, check=True,
                )  # fmt: skip
                print(f"\n== {name}: stepscope runs, by cumulative time ==")
                print(profile_top(cli_prof))
    finally:
        if server is not None:
            server.stop()
    print(f"\nmedians of {a.reps} ({a.runs} runs, {a.steps} steps and {a.samples} samples each):")
    print("| backend | version | first list | `stepscope runs` | `runs --json` | Runs page, first"
          " run | Runs page, rerun |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, got in results["backends"].items():
        med = {k: statistics.median(v) for k, v in got.items()}
        got["median"] = med
        if "baseline_cli" in med:
            print(f"| {name} | baseline | | {med['baseline_cli']:.2f} s |"
                  f" {med['baseline_json']:.2f} s | {med['baseline_page_cold']:.2f} s |"
                  f" {med['baseline_page_warm']:.2f} s |")  # fmt: skip
        print(f"| {name} | this tree | {med['first']:.2f} s | {med['cli']:.2f} s |"
              f" {med['json']:.2f} s | {med['page_cold']:.2f} s | {med['page_warm']:.2f} s |")  # fmt: skip
    results["load_after"] = os.getloadavg()
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
