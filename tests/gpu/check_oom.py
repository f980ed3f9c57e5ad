"""Checks the CUDA side of the out-of-memory record (issue 38), as a user gets it.

    PYTHONPATH=/path/to/repo python tests/gpu/check_oom.py [--home DIR]

Records a small training job that, at its third step, asks the GPU for twice its
memory, once with the job recording CUDA memory history itself and once without, and
reads the run back: the run failed with torch's OutOfMemoryError; the `oom` record has
the bytes asked (CUDA's "Tried to allocate X GiB", within its two printed decimals),
the allocator's allocated and reserved bytes and the device's total, step 2 and the
job's own line; the model's state on the GPU (the Linear's weights and gradients); the
first finding is memory/capacity; the verdict says out of memory and what held it;
with history a `memory_snapshot` artifact that reads as plain data, without it none. PASS/FAIL
lines; exit 1 if any check fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from stepscope.store import RunStore  # noqa: E402
from stepscope.store.plain_pickle import load_plain_pickle  # noqa: E402

JOB = """\
import sys
import torch
from torch import nn

if sys.argv[1] == "history":
    torch.cuda.memory._record_memory_history(max_entries=10000)
model = nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total = torch.cuda.get_device_properties(0).total_memory
for step in range(4):
    rows = 64 if step < 2 else (2 * total) // (1024 * 4)
    x = torch.randn(rows, 1024, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
"""
FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        FAILURES.append(name)


def record(home: Path, mode: str) -> None:
    script = home / "cuda_oom_job.py"
    script.write_text(JOB)
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", "--no-profile"]
        + ["--", sys.executable, str(script), mode],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=home,
    )
    with RunStore(home) as store:
        run_id = store.resolve_run("last")
        run = store.run(run_id)
        findings = store.findings(run_id)
        snapshots = store.artifacts(run_id)
    check(f"{mode}: the run failed", run["status"] == "failed", run["status"])
    check(f"{mode}: OutOfMemoryError", "OutOfMemoryError" in str(run["error"]), run["error"])
    records = (run["config"] or {}).get("oom") or []
    check(f"{mode}: one oom record", len(records) == 1, str(records))
    if not records:
        return
    rec = records[0]
    total = rec.get("cuda_total_bytes") or 0
    asked = rec.get("bytes_asked") or 0
    check(f"{mode}: bytes asked ~ 2x the device", abs(asked - 2 * total) < 0.01 * total, str(rec))
    check(f"{mode}: allocated/reserved read", (rec.get("cuda_reserved_bytes") or 0) > 0, str(rec))
    check(f"{mode}: step 2", rec.get("step") == 2, str(rec.get("step")))
    check(f"{mode}: the job's line", "cuda_oom_job.py:12" in str(rec.get("source")), rec["source"])
    # the model's state on the GPU: a 1024 x 1024 Linear's weight and bias, their
    # gradients from step 1, SGD keeps no state; and the verdict's line that says so
    held = rec.get("model_state") or {}
    weights = (1024 * 1024 + 1024) * 4
    check(
        f"{mode}: model state on cuda:0",
        held.get("parameters") == weights and held.get("gradients") == weights
        and held.get("optimizer_state") == 0,
        str(held),
    )  # fmt: skip
    check(f"{mode}: the verdict says what held it", "held by the model's state" in proc.stderr)
    check(
        f"{mode}: memory/capacity first",
        bool(findings) and findings[0].key == "memory/capacity",
        str([f.key for f in findings]),
    )
    check(f"{mode}: the verdict says out of memory", "verdict: out of memory" in proc.stderr)
    kept = snapshots[snapshots["kind"] == "memory_snapshot"] if not snapshots.empty else snapshots
    if mode == "history":
        ok = len(kept) == 1
        if ok:
            # never pickle.load: read as plain data, as stepscope reads every snapshot
            ok = bool(load_plain_pickle(kept.iloc[0]["path"]).get("segments"))
        check("history: a snapshot at the OOM that reads as plain data", ok, str(kept))
    else:
        check("no history: no snapshot", len(kept) == 0, str(kept))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path)
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope-oom-"))
    for mode in ("history", "plain"):
        (home / mode).mkdir(parents=True, exist_ok=True)
        record(home / mode, mode)
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
