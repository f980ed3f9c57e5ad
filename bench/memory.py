"""Memory figures against the truth: the largest batch a sweep finds against a search by
hand, and checkpointing's predicted saving against the peak it measures.

    python bench/memory.py                      # both tables (~15 min on 2 cores)
    python bench/memory.py --only batch         # the largest batch alone (also: saving, cost)
    python bench/memory.py --only saving --saving-jobs resnet_highres
    python bench/memory.py --json-out bench/results/memory.json

**The largest batch.** The corpus's GPT trainer (examples/corpus/gpt_trainer.py, six
blocks over 256 tokens: its attention scores are most of its memory) is recorded at batch
2 under an address-space limit and swept (``stepscope optimize --sweep batch --steps 4
--trials 1``). The truth is a search by hand, as a user would do it: the job run
plainly under the same limit (``stepscope run --no-profile --memory-limit``), batch
doubled from 2 until one runs out, then bisected to one sample. Both under glibc's default
allocator and with its mapping threshold fixed (``MALLOC_MMAP_THRESHOLD_``): the default
makes the peak uneven in the batch (``optim_runner/sweeps/largest_batch.py``). Per row:
the sweep's first prediction (from its own batches), the batch it found and the runs it
spent, the batch found by hand and its runs.

**Checkpointing's saving.** The same trainer at batch 8, twelve blocks, the corpus's
ResNet at a high resolution (examples/corpus/resnet_highres.py: 14 BasicBlocks in two
``nn.Sequential`` stages) and the Hugging Face Trainer fine-tune (hf_trainer.py, seq 512:
checkpointed by the model's own switch, predicted from its first block's probe), each
without a limit, under both allocator settings:
``stepscope optimize --fixes activation_checkpointing --goal memory --trials 2``; the
saving the fix predicted in the job (``predict_saving``: the blocks' saved bytes from a
probe forward, less one block and their inputs), read from the trial's applied change,
against the measured one (the baseline's peak minus the arm's: RSS, and the address
space). The issue's goal: within 25 %.

**What the memory section costs the analysis.** The trainer with two blocks recorded
with its default capture (trace and memory timeline), then, side by side in one process:
the whole of ``stepscope analyze RUN --json`` (a subprocess, as a user runs it) and the
memory section alone (``memory_summary``: the timeline read, the peak split, the blocks
placed in modules and lines), medians of five; the section's share of the analysis.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
GPT = str(REPO / "examples" / "corpus" / "gpt_trainer.py")
SMALL = ("--layers", "6", "--dim", "64", "--seq", "256", "--vocab", "256", "--steps", "4")
LIMIT = "1.6GB"
FIXED_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
DEEP = ("--layers", "12", "--dim", "64", "--seq", "256", "--vocab", "256", "--batch", "8")
# small enough that its capture's trace stays under the memory timeline's 1 MiB bound
CORPUS = REPO / "examples" / "corpus"
# checkpointing's saving, per corpus job: the script and its arguments (six steps)
SAVING_JOBS = {
    "gpt_trainer": (GPT, *DEEP, "--steps", "6"),
    "resnet_highres": (
        str(CORPUS / "resnet_highres.py"),
        "--blocks", "12", "--image-size", "128", "--batch-size", "16", "--iters", "6",
    ),
    "hf_trainer": (
        str(CORPUS / "hf_trainer.py"),
        "--seq-len", "512", "--n-layer", "6", "--n-embd", "64", "--n-head", "8",
        "--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "1",
        "--max-steps", "6",
    ),
}  # fmt: skip
CAPTURED = ("--layers", "2", "--dim", "64", "--seq", "128", "--vocab", "256", "--batch", "4")


def stepscope(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "STEPSCOPE_BUSY_REPEATS": "0", **(env or {})}
    full.pop("STEPSCOPE_HOME", None)
    cmd = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=3600)


def last_run(home: Path) -> dict[str, Any]:
    with RunStore(home) as store:
        return store.run(store.resolve_run("last"))


def fits_by_hand(home: Path, batch: int, env: dict[str, str]) -> bool:
    """The job run plainly at ``batch`` under the limit: did it complete?"""
    stepscope(
        home, "run", "--no-profile", "--memory-limit", LIMIT, "--",
        sys.executable, GPT, *SMALL, "--batch", str(batch), env=env,
    )  # fmt: skip
    run = last_run(home)
    if run["status"] not in ("completed", "failed"):
        raise RuntimeError(f"batch {batch}: {run['status']} {run.get('error')}")
    if run["status"] == "failed" and not (run.get("config") or {}).get("oom"):
        raise RuntimeError(f"batch {batch} failed, not for memory: {run.get('error')}")
    return run["status"] == "completed"


def search_by_hand(home: Path, env: dict[str, str]) -> tuple[int, int]:
    """(largest batch that ran, runs spent): doubling from 2, then bisection to one."""
    runs, fits, miss = 0, 1, None
    batch = 2
    while miss is None:
        runs += 1
        if fits_by_hand(home, batch, env):
            fits, batch = batch, batch * 2
        else:
            miss = batch
    while miss - fits > 1:
        mid = (fits + miss) // 2
        runs += 1
        if fits_by_hand(home, mid, env):
            fits = mid
        else:
            miss = mid
    return fits, runs


def largest_batch_row(allocator: str, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        fits_by_hand(home, 2, env)
        base = last_run(home)["id"]
        proc = stepscope(
            home, "optimize", str(base), "--sweep", "batch", "--steps", "4", "--trials", "1",
            "--json", env=env,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        result = json.loads(proc.stdout)
        by_hand, hand_runs = search_by_hand(home, env)
    largest = result["largest_batch"]
    return {
        "allocator": allocator,
        "predicted": largest["predicted"],
        "found": largest["batch_size"],
        "out_of_memory_at": largest["smallest_out_of_memory"],
        "sweep_runs": sum(len(r["runs"]) for r in result["rows"]),
        "by_hand": by_hand,
        "hand_runs": hand_runs,
        "note": largest.get("note"),
    }


def saving_row(job: str, allocator: str, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        stepscope(home, "run", "--no-profile", "--", sys.executable, *SAVING_JOBS[job], env=env)
        base = last_run(home)
        proc = stepscope(
            home, "optimize", str(base["id"]), "--fixes", "activation_checkpointing",
            "--goal", "memory", "--trials", "2", "--steps", "4", "--json", env=env,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        result = json.loads(proc.stdout)
        arm = next(c for c in result["candidates"] if c["fixes"] == ["activation_checkpointing"])
        with RunStore(home) as store:
            runs = [store.run(r) for r in arm["runs"]]
            base_runs = [store.run(r) for r in result["baseline"]["runs"]]
    predicted = None
    for entry in (runs[0].get("config") or {}).get("applied") or []:
        found = re.search(r"predicted saving ([\d.]+) MiB", str(entry.get("change", "")))
        if found:
            predicted = float(found.group(1)) * 2**20

    def median(rows: list[dict[str, Any]], key: str) -> float:
        values = sorted(r["config"]["peak_memory"][key] for r in rows)
        return values[len(values) // 2]

    rss = median(base_runs, "rss_bytes") - median(runs, "rss_bytes")
    vm = median(base_runs, "vm_peak_bytes") - median(runs, "vm_peak_bytes")
    return {
        "job": job,
        "allocator": allocator,
        "predicted_bytes": predicted,
        "measured_rss_bytes": rss,
        "measured_vm_bytes": vm,
        "rss_over_predicted": rss / predicted if predicted else None,
        "vm_over_predicted": vm / predicted if predicted else None,
    }


def section_cost(reps: int = 5) -> dict[str, Any]:
    from stepscope.app.cli.memory import memory_summary

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        stepscope(home, "run", "--", sys.executable, GPT, *CAPTURED, "--steps", "6")
        run_id = last_run(home)["id"]
        whole, section = [], []
        for _ in range(reps):
            started = time.perf_counter()
            stepscope(home, "analyze", str(run_id), "--json")
            whole.append(time.perf_counter() - started)
            with RunStore(home) as store:
                started = time.perf_counter()
                summary = memory_summary(store, run_id)
                section.append(time.perf_counter() - started)
        if not summary or not summary.get("peak_bytes"):
            raise RuntimeError(f"run {run_id} has no memory breakdown: {summary}")
    whole_s, section_s = statistics.median(whole), statistics.median(section)
    return {"analyze_s": whole_s, "memory_section_s": section_s, "share": section_s / whole_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("batch", "saving", "cost"))
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--saving-jobs",
        default=",".join(SAVING_JOBS),
        help=f"the corpus jobs of the saving table, by name (default: {','.join(SAVING_JOBS)})",
    )
    args = parser.parse_args()
    console = Console()
    out: dict[str, Any] = {}
    if args.only in (None, "batch"):
        rows = [
            largest_batch_row("glibc default", {}),
            largest_batch_row("threshold fixed", FIXED_THRESHOLD),
        ]
        table = Table(title=f"Largest batch under {LIMIT}: the sweep against a search by hand")
        for col in (
            "allocator",
            "predicted",
            "found",
            "ran out at",
            "sweep runs",
            "by hand",
            "hand runs",
        ):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["allocator"], str(r["predicted"]), str(r["found"]), str(r["out_of_memory_at"]),
                str(r["sweep_runs"]), str(r["by_hand"]), str(r["hand_runs"]),
            )  # fmt: skip
        console.print(table)
        for r in rows:
            if r["note"]:
                console.print(f"{r['allocator']}: {r['note']}")
        out["largest_batch"] = rows
    if args.only in (None, "saving"):
        rows = [
            saving_row(job, allocator, env)
            for job in args.saving_jobs.split(",")
            for allocator, env in (("glibc default", {}), ("threshold fixed", FIXED_THRESHOLD))
        ]
        mib = 2**20
        for row in rows:
            predicted = row["predicted_bytes"]
            console.print(
                f"activation_checkpointing on {row['job']}, {row['allocator']}: predicted "
                + (f"{predicted / mib:.0f} MiB" if predicted else "nothing (no probe)")
                + f"; measured {row['measured_rss_bytes'] / mib:.0f} MiB resident"
                + (f" ({row['rss_over_predicted']:.2f}x)" if predicted else "")
                + f", {row['measured_vm_bytes'] / mib:.0f} MiB of address space"
                + (f" ({row['vm_over_predicted']:.2f}x)" if predicted else "")
            )
        out["saving"] = rows
    if args.only in (None, "cost"):
        row = section_cost()
        console.print(
            f"memory section: {row['memory_section_s']:.2f} s of `analyze --json`'s "
            f"{row['analyze_s']:.2f} s ({row['share']:.0%}), medians of 5"
        )
        out["section_cost"] = row
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
