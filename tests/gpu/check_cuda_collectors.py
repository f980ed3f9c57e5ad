"""Checks the in-job collectors on a CUDA machine: run by hand, not by pytest.

    PYTHONPATH=/path/to/repo python tests/gpu/check_cuda_collectors.py

Runs tests/gpu/cuda_job.py under the bootstrap (no launcher) with a capture window and
a step limit, then checks what reached the store: device_s from CUDA events and close
to the host step time, losses read back lazily, a trace with CUDA kernels and exactly K
ProfilerStep# ranges, and a CUDA memory snapshot that unpickles. Prints PASS/FAIL lines;
exits 1 if any check fails.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from stepscope.collectors.launch.job_env import build_job_env  # noqa: E402
from stepscope.collectors.steps.step_accounting import AFTER_CAPTURE_STEPS  # noqa: E402
from stepscope.store import RunStore  # noqa: E402
from stepscope.store.plain_pickle import load_plain_pickle  # noqa: E402

MAX_STEPS, PROFILE_AT, PROFILE_STEPS = 60, 20, 3
failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  (' + detail + ')' if detail else ''}", flush=True)


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("FAIL  no CUDA device visible to torch")
        return 1
    home = Path(tempfile.mkdtemp(prefix="stepscope_gpu_check_"))
    job = Path(__file__).with_name("cuda_job.py")
    cmd = [sys.executable, str(job)]
    with RunStore(home) as store:
        run_id = store.create_run(cmd, name="cuda-check")
        run_dir = store.run_dir(run_id)
    env = build_job_env(
        run_id,
        home,
        run_dir,
        max_steps=MAX_STEPS,
        profile_at=PROFILE_AT,
        profile_steps=PROFILE_STEPS,
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    check("job exits 0 after max_steps", proc.returncode == 0, f"rc={proc.returncode}")
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
    with RunStore(home) as store:
        run = store.run(run_id)
        steps = store.steps(run_id)
        arts = store.artifacts(run_id)
        events = store.events(run_id)
    for _, e in events.iterrows():
        print(f"      log: {e['level']} {e['source']}: {e['message']}")
    check("stop_reason recorded", run["stop_reason"] == "max_steps", str(run["stop_reason"]))
    check("all steps recorded", len(steps) == MAX_STEPS, f"{len(steps)} rows")
    dev = run["device"]
    check(
        "device info recorded",
        bool(dev.get("device_name")) and dev.get("cuda_available") is True,
        f"{dev.get('device_name')} cc {dev.get('capability')} cuda {dev.get('cuda_version')}",
    )

    with_dev = steps["device_s"].notna()
    check(
        "device_s recorded for (nearly) every step",
        with_dev.sum() >= MAX_STEPS - 1,
        f"{int(with_dev.sum())}/{len(steps)}",
    )
    # steady state: once the launch queue is full the host runs at the device's pace
    tail = steps[(steps["step"] >= MAX_STEPS // 2) & (steps["profiled"] == 0) & with_dev]
    host = statistics.median(tail["end_s"] - tail["start_s"]) if len(tail) else float("nan")
    device = statistics.median(tail["device_s"]) if len(tail) else float("nan")
    ratio = device / host if host else float("nan")
    check(
        "device_s close to host step time (steady state)",
        0.8 <= ratio <= 1.25,
        f"median device {device * 1e3:.2f} ms, host {host * 1e3:.2f} ms, ratio {ratio:.3f}",
    )
    losses = steps["loss"].dropna()
    check(
        "loss recorded lazily",
        len(losses) >= MAX_STEPS - 1 and all(map(math.isfinite, losses)),
        f"{len(losses)} losses, last {losses.iloc[-1] if len(losses) else None}",
    )
    check("batch size recorded", set(steps["batch_size"].dropna()) == {256})

    traces = arts[arts["kind"] == "trace"]
    check("one trace artifact", len(traces) == 1, f"{len(traces)}")
    if len(traces):
        with gzip.open(traces["path"].iloc[0], "rt") as f:
            trace = json.load(f)
        ev = trace["traceEvents"]
        # CPU-side ranges only: Kineto mirrors some as 'gpu_user_annotation' on the GPU row
        names = sorted(
            e["name"]
            for e in ev
            if str(e.get("name", "")).startswith("ProfilerStep#")
            and e.get("ph") == "X"
            and e.get("cat") == "user_annotation"
        )
        gpu_names = sorted(
            e["name"]
            for e in ev
            if str(e.get("name", "")).startswith("ProfilerStep#")
            and e.get("cat") == "gpu_user_annotation"
        )
        print(f"      GPU-side ProfilerStep ranges: {gpu_names}")
        want = [f"ProfilerStep#{PROFILE_AT + i}" for i in range(PROFILE_STEPS)]
        check("trace has exactly K ProfilerStep# events", names == want, str(names))
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        gemm = [e for e in kernels if "gemm" in e["name"].lower() or "nvjet" in e["name"].lower()]
        check(
            "trace has CUDA kernels",
            len(kernels) > 0,
            f"{len(kernels)} kernels, {len(gemm)} GEMM-like",
        )
    snaps = arts[arts["kind"] == "memory_snapshot"]
    check("one memory snapshot artifact", len(snaps) == 1, f"{len(snaps)}")
    if len(snaps):
        snap = load_plain_pickle(snaps["path"].iloc[0])  # never pickle.load: plain data only
        traces_n = sum(len(t) for t in snap.get("device_traces", []))
        check(
            "memory snapshot reads as plain data",
            "segments" in snap and traces_n > 0,
            f"{len(snap['segments'])} segments, {traces_n} trace entries",
        )
    # the window's steps and the slow ones right after it (the profiler's teardown)
    profiled = steps.loc[steps["profiled"] == 1, "step"].tolist()
    check(
        "profiled steps flagged",
        profiled == list(range(PROFILE_AT, PROFILE_AT + PROFILE_STEPS + AFTER_CAPTURE_STEPS)),
        str(profiled),
    )
    check_compile(home)
    print(f"{'ALL PASS' if failures == 0 else f'{failures} FAILED'}  (store: {home})")
    return 1 if failures else 0


def check_compile(home: Path) -> None:
    """Global forward hooks are live while torch.compile traces an inference model:
    they must trace to nothing (no graph breaks) and still count outermost calls."""
    job = Path(__file__).with_name("compile_job.py")
    for mode in ("infer", "train"):
        cmd = [sys.executable, str(job), mode]
        with RunStore(home) as store:
            run_id = store.create_run(cmd, name=f"compile-{mode}")
            run_dir = store.run_dir(run_id)
        env = build_job_env(run_id, home, run_dir)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("graph_breaks")), "")
        check(f"compile/{mode}: job exits 0", proc.returncode == 0, proc.stderr[-1500:])
        check(f"compile/{mode}: no graph breaks", line.startswith("graph_breaks 0"), line)
        with RunStore(home) as store:
            steps = store.steps(run_id)
        kinds = set(steps["kind"])
        want = "forward" if mode == "infer" else "optimizer"
        check(
            f"compile/{mode}: 12 {want} steps",
            len(steps) == 12 and kinds == {want},
            f"{len(steps)} rows, kinds {kinds}",
        )


if __name__ == "__main__":
    sys.exit(main())
