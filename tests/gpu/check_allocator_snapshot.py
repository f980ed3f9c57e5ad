"""Checks the allocator snapshot reader against real CUDA snapshots (issue 38): by hand.

    PYTHONPATH=/path/to/repo python tests/gpu/check_allocator_snapshot.py [--home DIR]

tests/snapshots.py builds snapshots from torch's description of the format; this reads
real ones and compares the reader's figures with torch's own counters read at the
moment of the dump (``memory_reserved()``/``memory_allocated()``, nothing allocated in
between):

1. In this process, memory history on: tensors allocated in ``hold`` -> a snapshot:
   reserved and allocated equal torch's; reserved - allocated = unused + pending; the
   blocks' line is ``hold``'s (frames read innermost first).
2. A fragmented OOM made on purpose: every segment of 2H holding one tensor of H at its
   start, the device filled, then a 1.5H request: the reader says fragmented, largest
   free block H, the request and the device's free bytes as torch reported them.
3. A full OOM (twice the device): not fragmented, the request read back.
4. Under `stepscope run` (a 2-step capture): the capture's snapshot, read through the
   store (`run_memory`, `stepscope memory --json`), equals torch's counters, which the
   job records by wrapping ``torch.cuda.memory._dump_snapshot`` (the capture calls it
   by name); and a job that runs out of memory inside the capture: its snapshot row is
   marked ``reason: oom``, its figures equal torch's and the OOM record's, and the
   verdict explains the OOM from it.

Without CUDA it prints SKIP and exits 0. PASS/FAIL lines; exit 1 if any check fails.
``PYTORCH_CUDA_ALLOC_CONF`` is cleared for this process (expandable segments would make
the fragmentation of part 2 impossible).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # before torch reads it

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from stepscope.analyzers.report.run_memory import run_memory  # noqa: E402
from stepscope.analyzers.trace.allocator_snapshot import read_snapshot  # noqa: E402
from stepscope.store import RunStore  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
FAILURES: list[str] = []


def check(name: str, ok: bool, detail: Any = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail != "" and not ok else ""))
    if not ok:
        FAILURES.append(name)


def hold(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


# the line that allocates, as the frames name it (co_filename: the path as run)
HOLD_SITE = f"{hold.__code__.co_filename}:{hold.__code__.co_firstlineno + 1} in hold"


def counters() -> tuple[int, int]:
    return torch.cuda.memory_reserved(0), torch.cuda.memory_allocated(0)


def dump(folder: Path, name: str) -> tuple[Path, int, int]:
    """torch's counters, then the snapshot at once (nothing allocated in between)."""
    reserved, allocated = counters()
    path = folder / f"{name}.memory_snapshot.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    return path, reserved, allocated


def in_process(folder: Path) -> None:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    kept = [hold(n * MiB) for n in (64, 3, 200, 1)]
    freed = hold(100 * MiB)
    del freed  # cached, inactive
    path, reserved, allocated = dump(folder, "plain")
    a = read_snapshot(path, device=0)
    check(
        "1: reserved = memory_reserved()",
        a.reserved_bytes == reserved,
        (a.reserved_bytes, reserved),
    )
    check(
        "1: allocated = memory_allocated()",
        a.allocated_bytes == allocated,
        (a.allocated_bytes, allocated),
    )
    check(
        "1: reserved - allocated = unused + pending",
        reserved - allocated == a.unused_bytes + a.pending_free_bytes,
        (reserved - allocated, a.unused_bytes, a.pending_free_bytes),
    )
    check(
        "1: a free block of the 100 MiB freed",
        a.largest_free_block_bytes >= 100 * MiB,
        a.largest_free_block_bytes,
    )
    sites = dict(zip(a.sites["site"], a.sites["bytes"], strict=True))
    check(
        "1: the blocks' line is hold's (innermost job frame)",
        sites.get(HOLD_SITE, 0) >= 268 * MiB,
        sites,
    )
    check("1: no OOM", a.oom is None and a.explanation() is None)
    del kept
    torch.cuda.empty_cache()

    # 2: fragmentation made on purpose (H: 1/32 of the device, 4.4 GiB on an H200)
    total = torch.cuda.get_device_properties(0).total_memory
    h = max(total // 32 // MiB, 64) * MiB
    bigs = []
    while True:  # segments of 2H, as many as fit
        try:
            bigs.append(hold(2 * h))
        except torch.OutOfMemoryError:
            break
    free, _total = torch.cuda.mem_get_info()
    filler = None
    for margin in (h // 2, h):  # the device's rest but a margin below the 1.5H asked
        try:
            filler = hold(max(free - margin, 0)) if free > margin else None
            break
        except torch.OutOfMemoryError:
            continue
    n = len(bigs)
    del bigs  # n free segments of 2H, cached
    pairs = [(hold(h), hold(h)) for _ in range(n)]  # each segment split: [A][B]
    keep = [a for a, _b in pairs]
    del pairs  # the Bs freed: every segment [A][free H]
    asked = 3 * h // 2
    try:
        hold(asked)
        check("2: the 1.5H request fails", False, "it was allocated")
    except torch.OutOfMemoryError:
        device_free_now = torch.cuda.mem_get_info()[0]
        path, reserved, allocated = dump(folder, "fragmented")
        a = read_snapshot(path, device=0)
        check(
            "2: reserved = memory_reserved()",
            a.reserved_bytes == reserved,
            (a.reserved_bytes, reserved),
        )
        check(
            "2: allocated = memory_allocated()",
            a.allocated_bytes == allocated,
            (a.allocated_bytes, allocated),
        )
        check("2: an oom entry", a.oom is not None)
        if a.oom is not None:
            check("2: the request read back", abs(a.oom.asked_bytes - asked) < 512, a.oom)
            check(
                "2: the device's free bytes as torch saw them",
                abs(a.oom.device_free_bytes - device_free_now) <= 256 * MiB,
                (a.oom.device_free_bytes, device_free_now),
            )
        check(
            "2: largest free block is H",
            a.largest_free_block_bytes == h,
            a.largest_free_block_bytes,
        )
        check("2: n segments of 2H held", a.segments >= n >= 2, (a.segments, n))
        check("2: fragmented", a.fragmented is True, a.explanation())
        print("   ", a.explanation())
    del keep, filler
    torch.cuda.empty_cache()

    # 3: more than the device
    small = hold(64 * MiB)
    try:
        hold(2 * total)
        check("3: twice the device fails", False, "it was allocated")
    except torch.OutOfMemoryError:
        path, reserved, allocated = dump(folder, "full")
        a = read_snapshot(path, device=0)
        check(
            "3: reserved = memory_reserved()",
            a.reserved_bytes == reserved,
            (a.reserved_bytes, reserved),
        )
        check(
            "3: allocated = memory_allocated()",
            a.allocated_bytes == allocated,
            (a.allocated_bytes, allocated),
        )
        check(
            "3: the request read back",
            a.oom is not None and abs(a.oom.asked_bytes - 2 * total) < 512,
            a.oom,
        )
        check("3: not fragmented", a.fragmented is False, a.explanation())
        print("   ", a.explanation())
    del small
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()


JOB = """\
import json, os, sys
import torch
import torch.cuda.memory as cuda_memory
from torch import nn

SIDE = sys.argv[2]
_dump_snapshot = cuda_memory._dump_snapshot


def dump_with_counters(filename="dump_snapshot.pickle", *args, **kwargs):
    # torch's counters at the dump: stepscope calls torch.cuda.memory._dump_snapshot
    figures = {
        "path": os.path.abspath(filename),
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
    }
    with open(SIDE, "a") as f:
        f.write(json.dumps(figures) + "\\n")
    return _dump_snapshot(filename, *args, **kwargs)


cuda_memory._dump_snapshot = dump_with_counters


def hold(rows):
    return torch.randn(rows, 4096, device="cuda")  # HOLD


model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters())
total = torch.cuda.get_device_properties(0).total_memory
kept = []
for step in range(6):
    if sys.argv[1] == "oom" and step == 3:  # inside the capture of steps 2 and 3
        hold(2 * total // (4096 * 4))
    kept.append(hold(1024))
    x = torch.randn(256, 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item(), flush=True)
"""


def side_figures(side: Path, path: str) -> dict[str, Any] | None:
    if not side.exists():
        return None
    rows = [json.loads(line) for line in side.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(rows) if Path(r["path"]).name == Path(path).name), None)


def under_stepscope(home: Path, mode: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    job, side = home / "snapshot_job.py", home / "counters.jsonl"
    job.write_text(JOB)
    hold_line = (
        JOB.splitlines().index(next(ln for ln in JOB.splitlines() if ln.endswith("# HOLD"))) + 1
    )
    cli = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home)]
    proc = subprocess.run(
        [*cli, "run", "--profile-at", "2", "--profile-steps", "2", "--"]
        + [sys.executable, str(job), mode, str(side)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=home,
    )
    with RunStore(home) as store:
        run_id = store.resolve_run("last")
        run = store.run(run_id)
        arts = store.artifacts(run_id)
        b = run_memory(store, run_id)
    rows = arts[arts["kind"] == "memory_snapshot"]
    expected = "failed" if mode == "oom" else "completed"
    check(
        f"{mode}: the run {expected}",
        run["status"] == expected,
        (run["status"], proc.stderr[-800:]),
    )
    check(f"{mode}: one snapshot row", len(rows) == 1, list(arts["kind"]))
    if len(rows) != 1 or b.allocator is None:
        check(f"{mode}: the snapshot read", False, b.problems)
        return
    a = b.allocator
    # (a CUDA trace over 1 MiB gzipped has no timeline: that line is not the snapshot's)
    about_it = [p for p in b.problems if "memory_snapshot" in p]
    check(f"{mode}: the snapshot read without a problem", about_it == [], about_it)
    torch_side = side_figures(side, str(rows.iloc[0]["path"]))
    check(
        f"{mode}: the job saw the dump",
        torch_side is not None,
        side.read_text() if side.exists() else "",
    )
    if torch_side is not None:
        check(
            f"{mode}: reserved = memory_reserved()",
            a.reserved_bytes == torch_side["reserved"],
            (a.reserved_bytes, torch_side),
        )
        check(
            f"{mode}: allocated = memory_allocated()",
            a.allocated_bytes == torch_side["allocated"],
            (a.allocated_bytes, torch_side),
        )
    site = f"{job}:{hold_line} in hold"
    check(f"{mode}: hold's line holds blocks", site in set(a.sites["site"]), list(a.sites["site"]))
    data = json.loads(
        subprocess.run(
            [*cli, "memory", str(run_id), "--json"], capture_output=True, text=True, timeout=300
        ).stdout
    )
    snap = data.get("allocator_snapshot") or {}
    check(f"{mode}: memory --json", snap.get("reserved_bytes") == a.reserved_bytes, snap)
    if mode == "oom":
        record = ((run["config"] or {}).get("oom") or [{}])[0]
        check(
            "oom: the row says reason oom",
            rows.iloc[0]["meta"].get("reason") == "oom",
            rows.iloc[0]["meta"],
        )
        check("oom: the record names the snapshot", bool(record.get("snapshot")), record)
        check(
            "oom: the record's counters are the snapshot's",
            (record.get("cuda_reserved_bytes"), record.get("cuda_allocated_bytes"))
            == (a.reserved_bytes, a.allocated_bytes),
            (record, a.reserved_bytes, a.allocated_bytes),
        )
        check(
            "oom: the request read back",
            a.oom is not None
            and abs(a.oom.asked_bytes - (record.get("bytes_asked") or 0))
            <= 2 * MiB + 0.01 * (record.get("bytes_asked") or 0),
            (a.oom, record.get("bytes_asked")),
        )
        check("oom: not fragmented", a.fragmented is False, a.explanation())
        check(
            "oom: the verdict explains it",
            "the allocator snapshot: asked for" in proc.stderr,
            proc.stderr[-1500:],
        )
        print(proc.stderr[-1500:])
    else:
        check("capture: at the capture's end", a.oom is None and a.moment == "the capture's end")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP no CUDA device: the allocator snapshot checks need one")
        return 0
    home = args.home or Path(tempfile.mkdtemp(prefix="stepscope-snapshot-"))
    (home / "in_process").mkdir(parents=True, exist_ok=True)
    in_process(home / "in_process")
    for mode in ("capture", "oom"):
        under_stepscope(home / mode, mode)
    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
